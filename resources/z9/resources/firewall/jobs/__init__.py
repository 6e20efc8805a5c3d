"""The firewall type's job kinds (one module each; the reconciler they share in shared.py)."""
