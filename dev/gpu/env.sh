# source dev/gpu/env.sh: the project's Python environment on the GPU machine.
if [ -d .whl ] && [ ! -f /root/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /root/site .whl/*.whl && touch /root/site/.installed
fi
# Bytecode, as pip writes at install: the machine sets PYTHONDONTWRITEBYTECODE=1 and the
# wheelhouse goes in --no-compile, so without this every process compiles mlflow, sqlalchemy
# and snakemake from source at every import (README, the local profile). Once a machine.
if [ ! -f /root/.bytecode ] && [ -d /root/site ]; then
  python3 -m compileall -q -j 0 /root/site $(python3 -c "import site; print(*site.getsitepackages())") \
    > /dev/null 2>&1; touch /root/.bytecode
fi
export PYTHONPATH="$PWD:/root/site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/root/site/bin:$PATH"
export PYTHONUNBUFFERED=1
