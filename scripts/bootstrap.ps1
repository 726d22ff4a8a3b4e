<#
.SYNOPSIS
  Set up omni-edge's Windows side: a venv with ONE ONNX Runtime flavour (docs/install.md).

.DESCRIPTION
  Two uses, chosen by -Mode:

  route  (default) The Windows half of the Ryzen AI + RTX laptop set-up
         (docs/guide.md, "On a Ryzen AI + RTX laptop (WSL2 + Windows)"): a small venv
         with numpy and the flavour's onnxruntime build, nothing else. omni-edge
         itself runs inside WSL2 (vLLM runs only on Linux) and starts this
         venv's python.exe as a host-process route; the route worker arrives
         over stdin, so the venv needs neither omni-edge nor a copy of the
         repository.
  full   omni-edge itself on native Windows: pip install -e ".[run,<flavour>]"
         from this checkout (plan, verify and the ONNX Runtime stages; vLLM
         stages are refused on Windows with the remedy "use WSL2").

  Flavours (exactly one per environment: each installs the same onnxruntime
  module, and omni-edge refuses an environment with two, exit 2):
    directml  onnxruntime-directml: the iGPU (and any DirectX 12 GPU). Default.
    cpu       onnxruntime: the CPU EP only.
    cuda      onnxruntime-gpu: the NVIDIA GPU through the CUDA EP.
    openvino  onnxruntime-openvino: Intel CPUs, iGPUs and NPUs.
    qnn       onnxruntime-qnn 2.x: the Snapdragon Hexagon NPU (a plugin EP on
              top of onnxruntime; on Windows on Arm use Python >= 3.12, the
              first with PyYAML wheels for win_arm64).
    vitisai   the AMD NPU: onnxruntime-vitisai is not on PyPI; it comes with
              AMD's Ryzen AI software, whose installer creates a conda
              environment. This script does not install it: it checks that
              environment (-RyzenAiEnv) can import onnxruntime with the
              VitisAI EP and links it at <Prefix>\ryzen-ai, the path the
              recorded profile names.

.EXAMPLE
  powershell -ExecutionPolicy Bypass -File scripts\bootstrap.ps1
  powershell -ExecutionPolicy Bypass -File scripts\bootstrap.ps1 -Flavour vitisai -RyzenAiEnv C:\Users\me\miniforge3\envs\ryzen-ai-1.6.0
  powershell -ExecutionPolicy Bypass -File scripts\bootstrap.ps1 -Mode full -Flavour directml
#>
[CmdletBinding()]
param(
  [ValidateSet("directml", "cpu", "cuda", "openvino", "qnn", "vitisai")]
  [string]$Flavour = "directml",
  [ValidateSet("route", "full")]
  [string]$Mode = "route",
  # Where the route venvs live: C:\omni-edge\venv-<flavour> is the path
  # configs/profiles/strix-point-rtx5090-wsl-hostproc.json names (as /mnt/c/omni-edge/...).
  [string]$Prefix = "C:\omni-edge",
  [string]$RyzenAiEnv = "",
  [string]$Python = "py",
  [switch]$DryRun
)
$ErrorActionPreference = "Stop"

$packages = @{
  directml = "onnxruntime-directml>=1.24"
  cpu      = "onnxruntime>=1.24"
  cuda     = "onnxruntime-gpu>=1.24"
  openvino = "onnxruntime-openvino>=1.24"
  qnn      = "onnxruntime-qnn>=2"
}
$expectedEp = @{
  directml = "DmlExecutionProvider"
  cpu      = "CPUExecutionProvider"
  cuda     = "CUDAExecutionProvider"
  openvino = "OpenVINOExecutionProvider"
  qnn      = "QNNExecutionProvider"
  vitisai  = "VitisAIExecutionProvider"
}
function Log($msg) { Write-Host "[bootstrap] $msg" }

if ($Flavour -eq "vitisai") {
  if (-not $RyzenAiEnv) {
    throw "vitisai: pass -RyzenAiEnv <the conda environment AMD's Ryzen AI installer created> (onnxruntime-vitisai is not on PyPI)"
  }
  $exe = Join-Path $RyzenAiEnv "python.exe"
  if (-not (Test-Path $exe)) { throw "vitisai: $exe does not exist; install the Ryzen AI software first (ryzenai.docs.amd.com)" }
  $link = Join-Path $Prefix "ryzen-ai"
  if ($DryRun) { Log "would link $link -> $RyzenAiEnv and check its EPs"; exit 0 }
  New-Item -ItemType Directory -Force -Path $Prefix | Out-Null
  if (-not (Test-Path $link)) { New-Item -ItemType Junction -Path $link -Target $RyzenAiEnv | Out-Null }
  $python = Join-Path $link "python.exe"
} else {
  $venv = Join-Path $Prefix "venv-$Flavour"
  $python = Join-Path $venv "Scripts\python.exe"
  $spec = $packages[$Flavour]
  if ($Mode -eq "full") {
    $repo = Split-Path -Parent $PSScriptRoot
    $install = @("-e", "$repo[run,dev,$Flavour]")
  } else {
    $install = @("numpy", $spec)
  }
  if ($DryRun) { Log "would create $venv and pip install $($install -join ' ')"; exit 0 }
  if (-not (Test-Path $python)) {
    Log "creating $venv"
    New-Item -ItemType Directory -Force -Path $Prefix | Out-Null
    & $Python -3 -m venv $venv
    if ($LASTEXITCODE) { throw "python -m venv failed (is Python >= 3.10 installed? winget install Python.Python.3.12)" }
  }
  & $python -m pip install --disable-pip-version-check -q --upgrade pip
  Log "installing $($install -join ' ')"
  & $python -m pip install --disable-pip-version-check -q @install
  if ($LASTEXITCODE) { throw "pip install failed" }
}

# What the route offers: the same question omni-edge's probe asks.
$ep = $expectedEp[$Flavour]
$check = "import onnxruntime as o, sys; p = o.get_available_providers(); print(o.__version__, ' '.join(p)); sys.exit(0 if '$ep' in p else 3)"
if ($Flavour -eq "qnn") {
  # a plugin EP: registered the way omni-edge registers it (orchestrator/core/backends.py), then listed by get_ep_devices()
  $check = "import onnxruntime as o, onnxruntime_qnn as q, sys; o.register_execution_provider_library('onnxruntime-qnn', q.get_library_path()); d = [e.ep_name for e in o.get_ep_devices()]; print(o.__version__, ' '.join(d)); sys.exit(0 if '$ep' in d else 3)"
}
& $python -c $check
if ($LASTEXITCODE) { throw "$python does not offer $ep (see docs/install.md)" }
Log "ok: $python offers $ep"
Log "from WSL2 this interpreter is $(('/mnt/' + $python.Substring(0,1).ToLower() + $python.Substring(2)) -replace '\\','/')"
