"""The tests (a package, so that two test modules never share an import name).

Importing it turns Python's bytecode caches back on where ``PYTHONDONTWRITEBYTECODE`` turned
them off: without them every pytest process (each ``-n`` worker too) rewrites the assertions
of every test module and compiles ``proxy/`` again (about 9 s of CPU each), and each
``python -m proxy serve`` a test starts compiles ``proxy/`` again. They are ``__pycache__/``
folders, which git and the Docker build leave out.
"""

import sys

sys.dont_write_bytecode = False
