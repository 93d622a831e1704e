"""Command-line applications: everything with argparse or a main()."""
