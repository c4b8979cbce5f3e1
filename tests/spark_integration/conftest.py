"""The Spark session of the Spark test modules: one local[2] session, started by the
first module that needs it and shared by the others (``getOrCreate``: a SparkContext
costs seconds to start and only one runs per JVM). A module that stops it (a benchmark)
leaves the next one to start it again; the JVM ends with the test process."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17 (see `make java`)")
    from arrangedb.spark_integration import local_session

    return local_session("local[2]", memory_budget="64MiB")
