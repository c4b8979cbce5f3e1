"""The error of input that does not fit an arrangement."""


class SchemaError(ValueError):
    """Input that does not fit the arrangement: missing columns, wrong types, nulls."""
