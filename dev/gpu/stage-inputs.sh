#!/usr/bin/env bash
# What the calls to the GPU machine carry, made here in one go on a fresh checkout (none of it is
# committed: .whl/ and .cache/ are ignored). A session that starts from a clean clone otherwise
# rebuilds these by hand before its first lease.
#   .whl/                 the wheelhouse (../shared/tools/device-wheels.sh): snakemake, mlflow-skinny and
#                         what else the pipeline imports there, less the packages the machine has
#                         (forty-third session: numpy 2.5.2, pandas 3.0.6, pyarrow 25.0.1, matplotlib 3.11.2,
#                         pillow 12.3, PyYAML, requests, tqdm...): their wheels would shadow its own builds.
#                         ~42 MiB, so it travels in one call with GSM8K beside the ~3 MiB checkout
#                         (results/records moved aside; dev/README.md, "gpu/").
#   .cache/gsm8k/         GSM8K from ../shared/data/gsm8k (the machine has no ../shared)
#   .cache/real/c60-15/   MODEL=coder-1.5b: the 1.5B GGUF in 60 MiB chunks part15.NN (18), for
#                         assemble-model.sh; else .cache/real/c60/part.NN, the 0.5B (8)
#   .cache/commit         the commit the plans record (git rev-parse HEAD)
#
#   bash dev/gpu/stage-inputs.sh            # MODEL=coder-1.5b for the 1.5B
set -euo pipefail
cd "$(dirname "$0")/../.."
shared=../shared
model=${MODEL:-coder-0.5b}

if [ ! -f .whl/.staged ]; then
  rm -rf .whl && bash "$shared/tools/device-wheels.sh" .whl \
    gguf jsonschema sqlalchemy alembic datasets markdown > /dev/null
  # the machine's own (see above) and their dependencies that it has with them
  for name in numpy pandas pyarrow hf_xet huggingface_hub pyyaml filelock fsspec packaging requests \
              urllib3 certifi idna charset_normalizer typing_extensions tqdm matplotlib pillow fonttools \
              kiwisolver contourpy cycler pyparsing; do
    rm -f .whl/"$name"-[0-9]*.whl
  done
  touch .whl/.staged
fi
mkdir -p .cache/gsm8k && cp "$shared"/data/gsm8k/* .cache/gsm8k/
if [ "$model" = coder-1.5b ]; then
  gguf=.cache/real/qwen2.5-coder-1.5b-instruct.gguf chunks=.cache/real/c60-15 prefix=part15.
else
  gguf=.cache/real/qwen2.5-coder-0.5b-instruct.gguf chunks=.cache/real/c60 prefix=part.
fi
bash "$shared/tools/real-model.sh" .cache/real --model "$model" > /dev/null  # sha256-checked; kept when present
rm -rf "$chunks" && mkdir -p "$chunks" && split -b 60M -d -a 2 "$gguf" "$chunks/$prefix"
git rev-parse HEAD > .cache/commit
echo "staged: .whl ($(du -sh .whl | cut -f1), $(ls .whl/*.whl | wc -l) wheels), .cache/gsm8k," \
  "$(ls "$chunks" | wc -l) chunks in $chunks, commit $(cut -c1-7 .cache/commit)"
