"""The server job kinds: one module per kind (each sets ``KIND``; the executor finds them through
the type registry), and ``shared`` what they share."""
