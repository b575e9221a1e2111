"""Change data capture from PostgreSQL into pluggable destinations."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("etl-core")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
