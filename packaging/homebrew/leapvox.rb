# Homebrew formula TEMPLATE for leapvox (a Python-virtualenv formula), meant for a tap of your own:
#
#   brew tap-new you/leapvox && cp packaging/homebrew/leapvox.rb "$(brew --repo you/leapvox)/Formula/"
#   brew install --build-from-source you/leapvox/leapvox && brew test leapvox
#
# Fill in the placeholders marked PLACEHOLDER before use:
#   homepage, url  where the release source archive lives (a tag's .tar.gz, or the sdist from `python -m build`)
#   sha256         `shasum -a 256 <that archive>`
#
# How it installs: a private virtualenv under libexec with Homebrew's Python, then pip installs leapvox with its
# dependencies from PyPI as binary wheels (torch has no practical source build inside a formula; on macOS PyPI's
# torch wheel is the CPU/MPS build, so no CUDA pin is needed there). Installing from PyPI at install time is fine
# for a tap; homebrew-core would instead want every dependency as a `resource` (`brew update-python-resources`)
# and has no torch wheel policy, so this formula is not meant for homebrew-core as is.
class Leapvox < Formula
  include Language::Python::Virtualenv

  desc "Fast, faithful local text-to-speech for Qwen3-TTS models"
  homepage "https://example.com/leapvox" # PLACEHOLDER: the project page
  url "https://example.com/leapvox/leapvox-0.1.0.tar.gz" # PLACEHOLDER: release source archive
  sha256 "0000000000000000000000000000000000000000000000000000000000000000" # PLACEHOLDER
  license "Apache-2.0"

  depends_on "espeak-ng" # the bundled demo model's text front end runs the espeak-ng program
  depends_on "portaudio" # sounddevice: `speak --play` and the TUI's playback
  depends_on "python@3.12"

  def install
    venv = virtualenv_create(libexec, "python3.12")
    # The torch version leapvox is tested with; Core ML support (coremltools) on macOS.
    extras = OS.mac? ? "[coreml]" : ""
    system venv.root/"bin/python", "-m", "pip", "install", "--no-cache-dir", "torch==2.13.0",
           "#{buildpath}#{extras}"
    bin.install_symlink libexec/"bin/leapvox"
  end

  def caveats
    <<~EOS
      The Qwen3-TTS models download into the Hugging Face cache on first use (leapvox models pull NAME);
      `leapvox doctor` shows what this machine offers and whether `leapvox speak` works.
    EOS
  end

  test do
    assert_match "leapvox #{version}", shell_output("#{bin}/leapvox --version")
    assert_match "demo", shell_output("#{bin}/leapvox models list")
    system bin/"leapvox", "speak", "Hello from Homebrew.", "-o", testpath/"hello.wav"
    assert_path_exists testpath/"hello.wav"
  end
end
