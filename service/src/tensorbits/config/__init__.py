"""Settings: environment, command line, API keys, certificates and TLS."""
