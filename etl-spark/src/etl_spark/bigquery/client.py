"""The BigQuery client of a ``[destination]`` of ``type = "bigquery"``: the destination's, and ``etl check``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etl.api import ConfigError

if TYPE_CHECKING:
    from google.cloud import bigquery

    from etl_spark.bigquery.config import BigQueryConfig


def make_client(config: BigQueryConfig) -> bigquery.Client:
    """A client for the config's project and location, with its credentials (or none, for an emulator)."""
    from google.api_core.client_options import ClientOptions
    from google.cloud import bigquery

    options = ClientOptions(api_endpoint=config.endpoint) if config.endpoint else None
    if config.credentials_file:
        from google.oauth2 import service_account

        try:
            credentials: Any = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                config.credentials_file
            )
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot read the service-account key {config.credentials_file}: {type(exc).__name__}",
                hint="point credentials_file at a service-account JSON key, or leave it out for application default",
            ) from None
    elif config.endpoint:
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    else:
        credentials = None  # application default credentials
    return bigquery.Client(
        project=config.project, credentials=credentials, location=config.location, client_options=options
    )
