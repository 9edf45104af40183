from perftracker.cli.main import main

raise SystemExit(main())
