"""`python -m agentd` runs the command-line interface."""

from agentd.cli import main

if __name__ == "__main__":
    main()
