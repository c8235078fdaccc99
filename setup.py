"""Packaging shim: metadata lives in setup.cfg."""
import glob

from setuptools import setup

# templates/ and static/ sit at the top level (the stack's layout); installed
# copies go to <prefix>/share/agentd so a non-editable install finds them too.
setup(
    data_files=[
        ("share/agentd/templates", glob.glob("templates/*")),
        ("share/agentd/static", glob.glob("static/*")),
    ]
)
