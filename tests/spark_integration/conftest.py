"""One local[2] Spark session for every Spark test module of the run (a SparkContext
costs seconds to start and only one can run per JVM)."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17 (see `make java`)")
    from arrangedb.spark_integration import local_session

    s = local_session("local[2]", memory_budget="64MiB")
    yield s
    s.stop()
