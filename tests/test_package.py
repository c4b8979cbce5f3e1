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
    """Every exported name is what its module defines, is documented in the README, and
    an unknown name is an AttributeError, not None."""
    import inspect
    import pathlib

    import pytest

    import arrangedb

    readme = (pathlib.Path(arrangedb.__file__).parent / "README.md").read_text()
    for name in arrangedb.__all__:
        value = getattr(arrangedb, name)
        module = importlib.import_module(arrangedb._EXPORTS[name])
        assert value is getattr(module, name), name
        assert inspect.isclass(value) or inspect.isfunction(value), name
        assert value.__doc__, f"{name} has no docstring"
        assert name in readme, f"{name} is not mentioned in the README"
        assert name in dir(arrangedb)
    assert {"Engine", "Trace", "join", "group_by", "versions", "CorruptionError"} \
        <= set(arrangedb.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        arrangedb.nonesuch  # noqa: B018
    for layer in ["pager", "codecs", "spine", "ops", "spark_integration", "tools"]:
        importlib.import_module(f"arrangedb.{layer}")
