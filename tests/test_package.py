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


def test_numpy_sorts_are_tuned_only_where_avx512_sorts_are_slow(tmp_path):
    """On Zen 4 (AMD family 25 with AVX-512), importing arrangedb before numpy turns off
    numpy's AVX-512 kernels; elsewhere, after numpy, or when told not to, it does not."""
    import arrangedb

    def cpu(vendor, family, flags):
        path = tmp_path / f"{vendor}-{family}"
        path.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\n"
                        f"model\t\t: 17\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
        return str(path)

    assert arrangedb._slow_avx512_sorts(cpu("AuthenticAMD", 25, "fpu avx2 avx512f avx512bw"))
    assert not arrangedb._slow_avx512_sorts(cpu("AuthenticAMD", 25, "fpu avx2"))     # Zen 3
    assert not arrangedb._slow_avx512_sorts(cpu("AuthenticAMD", 26, "avx2 avx512f"))  # Zen 5
    assert not arrangedb._slow_avx512_sorts(cpu("GenuineIntel", 6, "avx2 avx512f"))
    assert not arrangedb._slow_avx512_sorts(str(tmp_path / "missing"))

    def setting(first: str, **env) -> str:
        code = f"import os, {first}; print(os.environ.get('NPY_DISABLE_CPU_FEATURES'))"
        clean = {k: v for k, v in __import__("os").environ.items()
                 if k not in ("NPY_DISABLE_CPU_FEATURES", "ARRANGEDB_TUNE_NUMPY")}
        out = subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()

    expected = ("X86_V4 AVX512_ICL AVX512_SPR"
                if arrangedb._slow_avx512_sorts() and arrangedb._numpy_version() >= (2, 4)
                else "None")
    assert setting("arrangedb") == expected
    assert setting("numpy, arrangedb") == "None"                  # too late: numpy loaded
    children = subprocess.run(   # ... but processes it starts (local Spark workers) can
        [sys.executable, "-c", "import numpy, arrangedb; print(arrangedb.numpy_sort_setting())"],
        env={k: v for k, v in __import__("os").environ.items()
             if k not in ("NPY_DISABLE_CPU_FEATURES", "ARRANGEDB_TUNE_NUMPY")},
        capture_output=True, text=True, check=True)
    assert children.stdout.strip() == expected
    assert setting("arrangedb", ARRANGEDB_TUNE_NUMPY="0") == "None"
    assert setting("arrangedb", NPY_DISABLE_CPU_FEATURES="X86_V4") == "X86_V4"


def test_an_engine_says_once_when_numpy_sorts_slowly_here():
    """Where numpy's sorts are slow and numpy loaded before arrangedb could tune it, the
    first engine warns, naming the setting; imported first, or told not to, it is quiet."""
    import os

    import arrangedb

    code = ("import warnings; warnings.simplefilter('always'); {first}\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    arrangedb.Engine(memory_budget='64MiB').close()\n"
            "    arrangedb.Engine(memory_budget='64MiB').close()\n"
            "print(sum(issubclass(x.category, arrangedb.SlowSortWarning) for x in w))")
    clean = {k: v for k, v in os.environ.items()
             if k not in ("NPY_DISABLE_CPU_FEATURES", "ARRANGEDB_TUNE_NUMPY")}

    def warned(first: str, **env) -> int:
        out = subprocess.run([sys.executable, "-c", code.format(first=first)],
                             env={**clean, **env}, capture_output=True, text=True, check=True)
        return int(out.stdout.strip())

    slow = arrangedb._slow_avx512_sorts() and arrangedb._numpy_version() >= (2, 4)
    assert warned("import numpy, arrangedb") == (1 if slow else 0)   # once, not per engine
    assert warned("import arrangedb, numpy") == 0
    assert warned("import numpy, arrangedb", ARRANGEDB_TUNE_NUMPY="0") == 0


def test_every_test_file_is_collected():
    """Each tests/**/test_*.py and bench/bench_*.py file is one pytest collects: a folder
    pytest skips by default (``build``) once hid the spine's build tests."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    files = {str(p.relative_to(root)) for p in (*root.glob("tests/**/test_*.py"),
                                                 *root.glob("bench/bench_*.py"))}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "tests", "bench"],
                         capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    collected = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    assert files - collected == set()
