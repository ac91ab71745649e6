"""Print the absolute path to pass as ``--user-dir``, from any working directory::

fairseq-train --user-dir "$(python -m fairseq_knowgen.user_dir)" ...
"""

import os


def path() -> str:
    return os.path.dirname(os.path.abspath(__file__))


if __name__ == "__main__":
    print(path())
