"""The file to hand to ``spark-submit`` (which needs a file, not a module)::

    spark-submit --master spark://host:7077 \\
        "$(python -c 'import nsqpy.pipeline.submit as m; print(m.__file__)')" \\
        --lookupd host:4161 --topic clicks --work-dir /shared/pipeline archive

The arguments are those of ``nsqpy-pipeline``; the master comes from spark-submit.
"""

import sys

from nsqpy.pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
