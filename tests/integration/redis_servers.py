"""Private redis-server processes for connection tests: a password, TLS, a Sentinel.

Each server listens on 127.0.0.1 on a free port, keeps nothing on disk but its own directory,
and is stopped (SIGTERM, then SIGKILL) by ``stop()``, which the fixtures always call.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

READY_TIMEOUT = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """``redis-server <config file>`` (``--sentinel`` for a sentinel) in its own directory."""

    def __init__(self, directory: Path, config: str, *, sentinel: bool = False) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.config_path = directory / "redis.conf"
        self.config_path.write_text(f'bind 127.0.0.1\ndir {directory}\nsave ""\nappendonly no\n{config}')
        self.log_path = directory / "redis.log"
        self._log = self.log_path.open("wb")
        args = ["redis-server", str(self.config_path), *(["--sentinel"] if sentinel else [])]
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, client: redis.Redis) -> None:
        """Until the server answers PING through ``client`` (which knows its TLS and password)."""
        deadline = time.monotonic() + READY_TIMEOUT
        try:
            while True:
                if self.proc.poll() is not None:
                    log = self.log_path.read_text()
                    raise AssertionError(f"redis-server exited {self.proc.returncode}:\n{log}")
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    if time.monotonic() > deadline:
                        log = self.log_path.read_text()
                        raise AssertionError(f"redis-server not ready:\n{log}") from None
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        finally:
            self._log.close()


def make_tls_files(directory: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    directory.mkdir(parents=True, exist_ok=True)
    names = ("ca.crt", "ca.key", "server.crt", "server.key", "server.csr")
    files = {name: directory / name for name in names}
    # Python 3.13 verifies strictly (VERIFY_X509_STRICT): both certificates need key usages and
    # identifiers, not only the server's address.
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )

    def openssl(*args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, cwd=directory)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=kumiko-test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", files["ca.key"], "-out", files["ca.crt"])  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", files["server.key"], "-out", files["server.csr"])  # fmt: skip
    openssl("x509", "-req", "-in", files["server.csr"], "-CA", files["ca.crt"], "-CAkey", files["ca.key"],
            "-CAcreateserial", "-days", "2", "-extfile", directory / "server.ext",
            "-out", files["server.crt"])  # fmt: skip
    return files
