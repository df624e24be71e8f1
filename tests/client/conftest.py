"""Fixtures for the client tests: a throwaway TLS certificate authority and server cert."""

from __future__ import annotations

import pytest

from nsqpy.testing.certs import Certs, make_certificates


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA and a server certificate for 127.0.0.1/localhost, made with the openssl CLI."""
    return make_certificates(tmp_path_factory.mktemp("certs"))
