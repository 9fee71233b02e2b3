from comfysup.cli import main

raise SystemExit(main())
