from torch_brickdev.tools.cli import main
raise SystemExit(main())
