"""What every other package may import and which imports none of them: the error types a user sees (errors.py),
the one way to write a file whole or not at all (io.py) and a figure (plots.py), and the Hydra entry point of the
scripts (cli.py). Nothing here loads torch."""
