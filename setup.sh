#!/usr/bin/env bash
# Set up everything on a fresh machine: the Debian packages the voices and G2P need, then the virtual environment
# at .venv with the project, its data/eval/test extras and the pinned CPU torch. Safe to run again.
# --with-nemo also installs the optional NeMo codec extra (a few minutes; the test command uses it).
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES="espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts fortunes libportaudio2 pulseaudio pulseaudio-utils libasound2-plugins build-essential cmake chromium chromium-driver"
missing=()
command -v espeak-ng >/dev/null || missing+=(espeak-ng)
command -v flite >/dev/null || missing+=(flite)
command -v text2wave >/dev/null || missing+=(festival)
[ -d /usr/share/festival/voices/english/kal_diphone ] || missing+=(festvox-kallpc16k)
[ -d /usr/share/festival/voices/english/ked_diphone ] || missing+=(festvox-kdlpc16k)
[ -d /usr/share/festival/voices/us/cmu_us_slt_arctic_hts ] || missing+=(festvox-us-slt-hts)
[ -f /usr/share/games/fortunes/fortunes ] || missing+=(fortunes)
ldconfig -p 2>/dev/null | grep -q libportaudio.so.2 || missing+=(libportaudio2)
command -v pulseaudio >/dev/null || missing+=(pulseaudio)
command -v parec >/dev/null || missing+=(pulseaudio-utils)
[ -e /usr/lib/x86_64-linux-gnu/alsa-lib/libasound_module_pcm_pulse.so ] || [ "$(uname -m)" != x86_64 ] || missing+=(libasound2-plugins)
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(build-essential)
command -v chromium >/dev/null || missing+=(chromium)  # the headless browser test of `s5 serve`'s page
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
    if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
        echo "setup: could not install system packages; run: sudo apt-get install -y $APT_PACKAGES" >&2
        exit 1
    fi
fi

PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
extras="test,voice"
[ "${1:-}" = "--with-nemo" ] && extras="test,voice,nemo"
.venv/bin/python -m pip install --quiet -e ".[$extras]"
# the Silero VAD model for spoken input (`s5 chat --voice`); it runs on onnxruntime, so its torch/torchaudio
# requirements (which would replace the pinned CPU torch) are skipped
.venv/bin/python -m pip install --quiet --no-deps "silero-vad==6.2.3"
# Distill-MOS, the naturalness judge (`tts/eval/metrics.py`): its package and the model code it builds on, without
# their requirements (torchaudio would replace the pinned CPU torch; `metrics.distillmos` stands in for it)
.venv/bin/python -m pip install --quiet --no-deps "distillmos==0.9.1" "xls-r-sqa==0.1.0"
