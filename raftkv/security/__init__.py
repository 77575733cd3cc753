"""Certificates, TLS settings and permission checks (docs/security.md)."""
