"""The network type's job kinds: the network's own (``network.py``), a member's (``members.py``), the region's SDN apply (``apply.py``)."""
