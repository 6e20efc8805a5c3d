"""The volume job kinds: one module per kind (each sets ``KIND``; the executor finds them through the
type registry), ``shared`` their phases, ``reconcile`` the world, the plan and the steps they share."""
