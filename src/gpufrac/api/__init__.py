"""The user API (FastAPI): the `/api/v1` routes written once (`user_api`) over the `ControlService`
protocol (`control_service`) that one machine's agent and a cluster's control plane implement."""
