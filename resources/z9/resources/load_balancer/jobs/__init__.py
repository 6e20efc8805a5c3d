"""The load_balancer job kinds: a module per kind (each sets ``KIND``: ``stop``, ``delete``,
``observe``), ``converge`` one reconciler under the three names that converge the appliances
(``JOB_KINDS``: Create, Configure, Start), and ``shared`` what they share. The executor finds them
through the type registry."""
