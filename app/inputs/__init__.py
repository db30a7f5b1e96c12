"""What the user hands hangscope, checked before anything connects: numbers (numbers.py), text and file
arguments (text.py), the files it reads (files.py) and the paths it writes (paths.py).

Every check here is linear in its input and refuses with an InputError (exit 2) whose message is one line naming
the flag or path, the value and what is wrong. Nothing here connects, resolves a name or runs anything.
"""
