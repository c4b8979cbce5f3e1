#!/usr/bin/env bash
# Spark (pip pyspark 4.x) needs Java 17 or newer on PATH or in JAVA_HOME.
set -euo pipefail
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
    echo "arrangedb: Java 17+ is required for Spark and was not found." >&2
    echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2
    echo "  or set JAVA_HOME to a Java 17+ installation." >&2
    exit 1
fi
version=$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${version%%.*}
if [ "${major:-0}" -lt 17 ] 2>/dev/null; then
    echo "arrangedb: Java $version found, Spark needs 17 or newer." >&2
    echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2
    exit 1
fi
