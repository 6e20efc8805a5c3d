"""SSH public keys as Proxmox and cloud-init take them: what z9 checks before a key reaches a VM.

Proxmox refuses, at the API, an ``sshkeys`` value with a line that ``ssh-keygen -l -f`` cannot read
(pve-common ``PVE::Tools::validate_ssh_public_keys``, called by qemu-server ``PVE/API2/Qemu.pm``
create_vm and update_vm: ``SSH public key validation error``). :func:`unreadable` reads a key the way
ssh-keygen does — as an OpenSSH public key (or certificate) whose blob parses and names the same type
as the line — with the ``cryptography`` package (``load_ssh_public_identity``), not a subprocess.

Proxmox then writes each key **unquoted** into the user-data of its cloud-init drive (qemu-server
``PVE/QemuServer/Cloudinit.pm`` ``cloudinit_userdata``: ``$content .= "  - $k\\n"``), so a comment
that holds YAML syntax (``a: b: c``, ``user: laptop``, `` #x``) makes a document that is invalid or
says something else, and cloud-init applies none of it (no key, no hostname). Such a key is refused
too (:func:`breaks_user_data`) rather than rewritten: quoting is not possible (the value must stay
a line ssh-keygen reads) and dropping the comment would change what the customer asked for.
"""
from __future__ import annotations

import yaml
from cryptography.hazmat.primitives.serialization import load_ssh_public_identity


def unreadable(line: str) -> str | None:
    """Why ``ssh-keygen -l`` would refuse the one-line key ``line``; None when it reads it."""
    try:
        load_ssh_public_identity(line.encode("ascii"))
    except UnicodeEncodeError:
        return "not ASCII"
    except Exception as e:  # ValueError, UnsupportedAlgorithm: the blob does not parse
        return f"not a public key ssh-keygen can read ({e})"
    return None


def breaks_user_data(line: str) -> bool:
    """Whether ``line``, written as Proxmox writes it (``  - <key>`` in a YAML block sequence), reads
    back as anything but that same string."""
    doc = f"ssh_authorized_keys:\n  - {line}\n"
    try:
        return yaml.safe_load(doc) != {"ssh_authorized_keys": [line]}
    except yaml.YAMLError:
        return True
