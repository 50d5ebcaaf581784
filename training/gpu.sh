#!/usr/bin/env bash
# One command on a lent GPU (the device tool): train for $MINUTES (default 8, so that loading and saving fit in
# ten) and leave a checkpoint to judge here.
#   training/gpu.sh s5        S5-TTS at the paper's size (configs/s5_paper.yaml) on training/tokens -> runs/gpu_s5
#   training/gpu.sh vocoder   the adversarial iSTFT vocoder (configs/vocoder_gan_gpu.yaml) on corpus_flac/
#                             -> runs/gpu_vocoder/step_N snapshots
# The checkout carries training/tokens; carry corpus_flac/ too (`s5 data compact --out corpus_flac --utterances 330`,
# 25 MB). Back here: `s5 codec campaign --judge runs/gpu_vocoder/step_* --run gpu` puts the vocoder's snapshots on
# the campaign's curve; `s5 eval --model runs/gpu_s5/export --json` judges S5.
# CONFIG, OUT, MINUTES and MAX_STEPS override the defaults; CPU=1 runs without a GPU (the tests' tiny run).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
python=${PYTHON:-.venv/bin/python}
minutes=${MINUTES:-8}
if [ -z "${CPU:-}" ] && ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "training/gpu.sh: no CUDA GPU here (CPU=1 runs it anyway, slowly)" >&2
    exit 2
fi
case "$what" in
    s5)
        exec "$python" -m tts.training.cli train --config "${CONFIG:-s5_paper}" --out "${OUT:-runs/gpu_s5}" \
            --max-minutes "$minutes" ${MAX_STEPS:+--max-steps "$MAX_STEPS"} ;;
    vocoder)
        exec "$python" -m tts.training.cli codec campaign --config "${CONFIG:-configs/vocoder_gan_gpu.yaml}" \
            --minutes "$minutes" --snapshots-to "${OUT:-runs/gpu_vocoder}" ${CPU:+--device cpu} ;;
    *)
        echo "usage: training/gpu.sh s5|vocoder" >&2
        exit 2 ;;
esac
