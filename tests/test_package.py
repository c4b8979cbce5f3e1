"""The package's shape: layers import as arrangedb.<layer>; `import codecs` stays Python's."""

import importlib
import subprocess
import sys


def test_codecs_is_still_the_standard_library():
    import codecs

    import arrangedb.codecs

    assert hasattr(codecs, "lookup") and codecs.lookup("utf-8").name == "utf-8"
    assert arrangedb.codecs is not codecs and hasattr(arrangedb.codecs, "encode")
    # and in a fresh interpreter started from the repository root
    out = subprocess.run([sys.executable, "-c", "import codecs, arrangedb; "
                          "print(codecs.lookup('latin-1').name)"],
                         capture_output=True, text=True, cwd=str(__import__("pathlib").Path(
                             arrangedb.__file__).parent))
    assert out.returncode == 0 and out.stdout.strip() == "iso8859-1", out.stderr


def test_public_api_names():
    import arrangedb

    for name in ["Engine", "Trace", "TraceHandle", "SchemaError", "MemoryBudget",
                 "BudgetExceeded", "SpillError", "PageFileError", "join", "reduce",
                 "distinct", "top_k", "threshold", "group_by"]:
        assert getattr(arrangedb, name) is not None
    for layer in ["pager", "codecs", "spine", "ops", "spark_integration", "tools"]:
        importlib.import_module(f"arrangedb.{layer}")
