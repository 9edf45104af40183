from perftracker.cli import main

raise SystemExit(main())
