"""Test helpers for the framework and for third-party plugin authors.

Installed as a pytest plugin (entry point ``pytest11``): the fixtures ``postgres_cluster`` (one
throwaway cluster per session and Postgres major) and ``pg_database`` (a fresh database per test)
are available to any test suite that has etl-core installed. Choose majors with
``--pg-major 15 --pg-major 18`` or ``ETL_TEST_PG_MAJORS=15,18``; by default the first installation
found is used.

Helpers: ``clusters`` (throwaway Postgres clusters to restart, freeze and give standbys), ``pipelines``
(configs for a test database, waiting), ``compare`` (source rows to compare with), ``runner`` (``etl run``
as a child process to kill and restart), ``workload`` (tables and concurrent writes for such tests),
``pgoutput_capture`` (real pgoutput payloads), ``store_contract`` (the tests every store must pass).
"""

from etl.demo_postgres import PostgresInstall, find_install, find_installs, free_port
from etl.testing.clusters import TemporaryCluster

__all__ = ["PostgresInstall", "TemporaryCluster", "find_install", "find_installs", "free_port"]
