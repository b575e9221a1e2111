"""Cross-package end-to-end tests: real Postgres (both majors), real pipelines."""
