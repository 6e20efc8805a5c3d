from z9.cli import main

raise SystemExit(main())
