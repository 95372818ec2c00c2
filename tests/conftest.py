"""Test-wide setup.

pytest (prepend import mode) puts the folder of every conftest.py on sys.path,
so this file makes the helpers in tests/ (e.g. `import peak_rss`) importable
from the test files in its subfolders too.
"""
