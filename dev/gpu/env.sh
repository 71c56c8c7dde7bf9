# source dev/gpu/env.sh: the project's Python environment on the GPU machine.
if [ -d .whl ] && [ ! -f /root/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /root/site .whl/*.whl && touch /root/site/.installed
fi
export PYTHONPATH="$PWD:/root/site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/root/site/bin:$PATH"
export PYTHONUNBUFFERED=1
