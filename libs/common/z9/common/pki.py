"""A Kubernetes cluster's PKI, owned by z9 (issue 11; research §2.5: the orchestrator, not the first
node, owns the CA, etcd CA, service-account key pair and front-proxy CA — as Cluster API's
``-ca``/``-etcd``/``-sa``/``-proxy`` secrets).

Everything is made with ``cryptography``: ECDSA P-256 keys (kubeadm's ``encryptionAlgorithm:
ECDSA-P256``; fast enough to make in the API transaction), X.509 CAs valid 10 years, client
certificates valid for what the caller asks. The private keys are stored **sealed** with the
installation key: AES-256-GCM (``cryptography.hazmat.primitives.ciphers.aead.AESGCM``), a fresh
96-bit nonce per seal and the cluster id as associated data, so a sealed blob copied onto another
cluster's row does not open. z9 never reads a key back from a VM.
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import os
import secrets
import string
from dataclasses import dataclass
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import Z9Error

CA_VALID_DAYS = 3650
#: the files of a cluster's PKI (kubeadm's names under /etc/kubernetes/pki)
CA_NAMES = {"ca": "kubernetes", "etcd/ca": "etcd-ca", "front-proxy-ca": "front-proxy-ca"}
TOKEN_ALPHABET = string.ascii_lowercase + string.digits


class SealError(Z9Error):
    """The installation key is missing or malformed, or a sealed blob does not open with it."""


@dataclass(frozen=True)
class InstallationKey:
    """The installation key (32 bytes) and its id (the first 16 hex digits of its SHA-256)."""

    raw: bytes

    @classmethod
    def parse(cls, text: str) -> "InstallationKey":
        """From base64 (urlsafe or standard, padding optional). Raises SealError."""
        t = text.strip()
        try:
            raw = base64.urlsafe_b64decode(t.replace("+", "-").replace("/", "_") + "=" * (-len(t) % 4))
        except (binascii.Error, ValueError) as e:
            raise SealError(f"Z9_INSTALLATION_KEY is not base64: {e}") from e
        if len(raw) != 32:
            raise SealError(f"Z9_INSTALLATION_KEY must be 32 bytes (base64), got {len(raw)}")
        return cls(raw)

    @staticmethod
    def generate() -> str:
        """A new key as text (what ``z9 dev`` writes)."""
        return base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")

    @property
    def key_id(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()[:16]

    def seal(self, cluster_id: str, material: dict[str, str]) -> tuple[str, bytes, bytes]:
        """``(key_id, nonce, sealed)`` of ``material`` (JSON), bound to ``cluster_id``."""
        nonce = os.urandom(12)
        sealed = AESGCM(self.raw).encrypt(nonce, json.dumps(material, sort_keys=True).encode(), cluster_id.encode())
        return self.key_id, nonce, sealed

    def open(self, cluster_id: str, key_id: str, nonce: bytes, sealed: bytes) -> dict[str, str]:
        """The material sealed for ``cluster_id``. Raises SealError (another key, tampered, or
        another cluster's blob)."""
        if key_id != self.key_id:
            raise SealError(f"cluster {cluster_id}: its keys were sealed with installation key {key_id}, "
                            f"not the configured one ({self.key_id})")
        try:
            plain = AESGCM(self.raw).decrypt(nonce, sealed, cluster_id.encode())
        except Exception as e:  # InvalidTag: wrong key, tampered blob, other cluster's blob
            raise SealError(f"cluster {cluster_id}: its sealed keys do not open ({e.__class__.__name__})") from e
        return json.loads(plain)


# ---------------------------------------------------------------- certificates

def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(k: ec.EllipticCurvePrivateKey) -> str:
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption()).decode()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _ca(cn: str) -> tuple[str, str]:
    k = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, key_cert_sign=True,
                                         content_commitment=False, data_encipherment=False, key_agreement=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(k.public_key()), critical=False)
            .sign(k, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode(), _key_pem(k)


#: the CA of the kubeconfigs z9 mints for users (not the cluster CA: the components' certificates
#: stay signed by that one). The API servers trust client certificates of both (their
#: ``--client-ca-file`` is :data:`CLIENT_CA_BUNDLE`, the cluster CA then this one); rotating this one
#: alone makes every kubeconfig minted before stop working, and every certificate the CSR API signed
#: for kube-apiserver-client (:data:`CLIENT_CA_CRT`), nothing else. The cluster CA stays in the
#: bundle: in kubeadm the API servers authenticate the components by it (controller-manager.conf,
#: scheduler.conf, admin.conf, the kubelets' client certificates — kubelet TLS bootstrap and rotation
#: go through the kube-apiserver-client-kubelet signer, still the cluster CA).
CLIENT_CA_BUNDLE = "/etc/kubernetes/pki/client-ca-bundle.crt"
#: the users' client CA itself, on every control plane: kube-controller-manager signs
#: ``kubernetes.io/kube-apiserver-client`` CSRs with it (``--cluster-signing-kube-apiserver-client-
#: {cert,key}-file``), so a certificate a cluster-admin gets through the CSR API is revoked by a
#: rotation like the kubeconfigs z9 mints (the key: 0600, pushed again by every rotation)
CLIENT_CA_CRT = "/etc/kubernetes/pki/client-ca.crt"
CLIENT_CA_KEY = "/etc/kubernetes/pki/client-ca.key"


def new_client_ca() -> tuple[str, str]:
    """A new users' client CA: ``(crt pem, key pem)``."""
    return _ca("z9-client-ca")


def client_ca_bundle(material: dict[str, str]) -> str | None:
    """What the API servers trust for client certificates (the cluster CA, then the users' client
    CA); None for a cluster made before there was a users' client CA (the cluster CA alone)."""
    if "client-ca.crt" not in material:
        return None
    return material["ca.crt"].rstrip("\n") + "\n" + material["client-ca.crt"]


def serial_hex(crt_pem: str) -> str:
    """A certificate's serial number, lower-case hex."""
    return format(x509.load_pem_x509_certificate(crt_pem.encode()).serial_number, "x")


def new_cluster_pki() -> dict[str, str]:
    """A cluster's PKI as kubeadm's files: ``ca.crt``/``ca.key``, ``etcd/ca.crt``/``etcd/ca.key``,
    ``front-proxy-ca.crt``/``front-proxy-ca.key``, ``sa.key``/``sa.pub``; and the users' client CA
    (``client-ca.crt``/``client-ca.key``: :data:`CLIENT_CA_BUNDLE`)."""
    out: dict[str, str] = {}
    for base, cn in CA_NAMES.items():
        out[f"{base}.crt"], out[f"{base}.key"] = _ca(cn)
    out["client-ca.crt"], out["client-ca.key"] = new_client_ca()
    sa = _key()
    out["sa.key"] = _key_pem(sa)
    out["sa.pub"] = sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return out


def ca_cert_hash(ca_crt_pem: str) -> str:
    """kubeadm's ``--discovery-token-ca-cert-hash``: ``sha256:`` + the SHA-256 of the CA's
    SubjectPublicKeyInfo (DER)."""
    cert = x509.load_pem_x509_certificate(ca_crt_pem.encode())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def client_certificate(ca_crt_pem: str, ca_key_pem: str, *, cn: str, orgs: tuple[str, ...],
                       expiry_s: int) -> tuple[str, str, dt.datetime]:
    """A fresh client certificate signed by the CA: ``(cert pem, key pem, not_after)``. RFC 5280's
    profile as a strict verifier holds it (``openssl verify -x509_strict``): an Authority Key
    Identifier naming the CA's key (§4.2.1.1: required in every certificate not self-signed) and a
    Subject Key Identifier of its own (§4.2.1.2). ``not_after`` is the certificate's notAfter exactly:
    whole seconds (a certificate's time has no fraction)."""
    ca = x509.load_pem_x509_certificate(ca_crt_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), None)
    k = _key()
    now = _now().replace(microsecond=0)
    not_after = now + dt.timedelta(seconds=expiry_s)
    try:  # the CA's own SKI (z9's CAs carry one), else one derived from its key as RFC 5280 method 1 does
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
            ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key())  # type: ignore[arg-type]
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
                        + [x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject).public_key(k.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, key_cert_sign=False,
                                         content_commitment=False, data_encipherment=False, key_agreement=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(k.public_key()), critical=False)
            .add_extension(aki, critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    return cert.public_bytes(serialization.Encoding.PEM).decode(), _key_pem(k), not_after


def kubeconfig(cluster_name: str, server: str, ca_crt_pem: str, crt_pem: str, key_pem: str, user: str) -> str:
    """A kubeconfig (YAML) for ``server`` with embedded credentials."""
    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    ctx = f"{user}@{cluster_name}"
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config", "preferences": {}, "current-context": ctx,
        "clusters": [{"name": cluster_name, "cluster": {"server": server, "certificate-authority-data": b64(ca_crt_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(crt_pem), "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": ctx, "context": {"cluster": cluster_name, "user": user}}],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def new_bootstrap_token() -> str:
    """A kubeadm bootstrap token ``[a-z0-9]{6}.[a-z0-9]{16}`` (``secrets``)."""
    pick = lambda n: "".join(secrets.choice(TOKEN_ALPHABET) for _ in range(n))  # noqa: E731
    return f"{pick(6)}.{pick(16)}"
