"""Benchmark: load one CT series with radcaliper, SimpleITK and MONAI; time, peak memory, voxels.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_load.py [--slices 300] [--size 512] [--repeats 3] [--data DIR]
                                    [--readers radcaliper,sitk,monai,io-floor]
                                    [--thp default|off] [--itk-path DIR]
                                    [--write-results [--label main]]

What it does, in one run:

1. Writes a synthetic CT series (CT Image Storage, explicit VR little endian, uint16 with
   BitsStored 12, RescaleSlope 1 / RescaleIntercept -1024 so HU need rescaling, a realistic
   ~5 KB header, random file names) under ``DIR/ct_<slices>x<size>x<size>/``, unless a series
   with the same parameters is already there. ``benchmarks/data/`` is gitignored.
2. Reads every file once so that all readers see the same (warm) page cache.
3. Runs each reader ``--repeats`` times, every run in a fresh Python process, readers
   interleaved (radcaliper, sitk, monai, radcaliper, ...). A run measures, inside the child:
   interpreter start (parent spawn to the child's first line), import time of the reader's
   libraries, and the wall time of the load call itself (``time.perf_counter``).
4. Peak memory of the load call: the child resets its peak RSS to the current RSS by writing
   ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0), reads ``VmRSS`` just before the call and
   ``VmHWM`` (peak RSS) just after it; the growth ``VmHWM - VmRSS_before`` is what the load
   call needed at its peak, in resident pages (the page cache is not counted). Where the reset
   is not allowed, ``ru_maxrss`` is used instead and the table says so (that figure can hide
   the load's peak under the import peak).
5. Sanity check: every reader's voxels are brought to (slices, rows, columns) and compared with
   radcaliper's; the maximum absolute difference in HU is reported (and whether the reader's
   slice order was reversed relative to radcaliper's, which sorts along the image normal).

Readers: ``radcaliper`` = ``ingestion.load_path(folder)`` (scan + load); ``sitk`` = SimpleITK
``ImageSeriesReader`` with ``GetGDCMSeriesFileNames`` + ``Execute``, output type float32;
``monai`` = ``monai.transforms.LoadImage(image_only=True)`` on the folder, default reader
(reported; PydicomReader when itk is not installed); ``monai-pydicom`` / ``monai-itk`` force
one reader; ``io-floor`` reads each file's pixel bytes into a float32 volume with no DICOM
parsing at all (a lower bound, not a DICOM reader; never counted as "the fastest").
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_DATA = HERE / "data"
RESULTS = HERE / "RESULTS.md"
MANIFEST = ".bench_series.json"  # hidden: radcaliper's scan skips dot files, glob('*') too
GENERATOR_VERSION = 1
READERS = ("radcaliper", "sitk", "monai", "monai-pydicom", "monai-itk", "io-floor")
DEFAULT_READERS = "radcaliper,sitk,monai,io-floor"
COMPETITORS = ("sitk", "monai", "monai-pydicom", "monai-itk")
TIME_TARGET = 1.2
MEMORY_TARGET = 2.0
MIB = 1024 * 1024


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def _params(slices: int, size: int, seed: int) -> dict[str, Any]:
    return {
        "generator": GENERATOR_VERSION,
        "slices": slices,
        "rows": size,
        "columns": size,
        "seed": seed,
        "transfer_syntax": "1.2.840.10008.1.2.1",
        "pixel": "uint16, BitsStored 12, RescaleSlope 1, RescaleIntercept -1024",
    }


def _phantom(rng: Any, size: int, z: float, extent_mm: float) -> Any:
    """One uint16 slice (stored values; HU = value - 1024): body, bone, lung, noise."""
    import numpy as np

    half = extent_mm / 2
    y, x = np.mgrid[-half : half : size * 1j, -half : half : size * 1j]
    hu = np.full((size, size), -1000.0)
    body = (x / 170) ** 2 + (y / 120) ** 2 <= 1
    hu[body] = 40.0
    for cx in (-70.0, 70.0):
        lung = ((x - cx) / 55) ** 2 + ((y + 10) / (70 + 0.05 * z)) ** 2 <= 1
        hu[lung] = -850.0
    spine = (x / 22) ** 2 + ((y - 80) / 22) ** 2 <= 1
    hu[spine] = 700.0 + 0.5 * z
    hu += rng.normal(0.0, 12.0, size=(size, size))
    return np.clip(np.rint(hu + 1024.0), 0, 4095).astype(np.uint16)


def _dataset(index: int, size: int, uids: dict[str, str], pixels: Any, z: float, fov: float) -> Any:
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.sequence import Sequence
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    sop = generate_uid()
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.MediaStorageSOPInstanceUID = sop
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.ImplementationClassUID = "1.2.826.0.1.3680043.8.498.1"
    meta.ImplementationVersionName = "RADCAL_BENCH"
    ds = Dataset()
    ds.file_meta = meta
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.InstanceCreationDate = "20240314"
    ds.InstanceCreationTime = "101500.000000"
    ds.SOPClassUID = CTImageStorage
    ds.SOPInstanceUID = sop
    ds.StudyDate = ds.SeriesDate = ds.AcquisitionDate = ds.ContentDate = "20240314"
    ds.StudyTime = "100301.000000"
    ds.SeriesTime = ds.AcquisitionTime = "100842.120000"
    ds.ContentTime = f"1008{42 + index // 100:02d}.{index % 100:02d}0000"
    ds.AccessionNumber = "ACC20240314001"
    ds.Modality = "CT"
    ds.Manufacturer = "RADCALIPER BENCH"
    ds.InstitutionName = "Synthetic General Hospital"
    ds.InstitutionAddress = "1 Phantom Road, Nowhere"
    ds.ReferringPhysicianName = "REFERRER^JANE"
    ds.StationName = "CTSIM01"
    ds.StudyDescription = "CT CHEST ABDOMEN PELVIS WITH CONTRAST"
    ds.SeriesDescription = "AXIAL 1.0 STANDARD"
    ds.InstitutionalDepartmentName = "Radiology"
    ds.OperatorsName = "TECH^A"
    ds.ManufacturerModelName = "Synthetic 128"
    ref = Dataset()
    ref.ReferencedSOPClassUID = CTImageStorage
    ref.ReferencedSOPInstanceUID = uids["scout"]
    ds.ReferencedImageSequence = Sequence([ref])
    ds.PatientName = "BENCH^PHANTOM"
    ds.PatientID = "BENCH0001"
    ds.PatientBirthDate = "19700101"
    ds.PatientSex = "O"
    ds.PatientAge = "054Y"
    ds.PatientSize = 1.75
    ds.PatientWeight = 72.0
    ds.ContrastBolusAgent = "IOHEXOL 350"
    ds.BodyPartExamined = "CHEST"
    ds.ScanOptions = "HELICAL MODE"
    ds.SliceThickness = 1.0
    ds.KVP = 120
    ds.DataCollectionDiameter = 500.0
    ds.DeviceSerialNumber = "000000"
    ds.SoftwareVersions = ["BENCH 1.0", "RECON 2.3"]
    ds.ProtocolName = "CAP_ROUTINE"
    ds.ReconstructionDiameter = fov
    ds.DistanceSourceToDetector = 1040.0
    ds.DistanceSourceToPatient = 570.0
    ds.GantryDetectorTilt = 0.0
    ds.TableHeight = 160.0
    ds.RotationDirection = "CW"
    ds.ExposureTime = 500
    ds.XRayTubeCurrent = 250
    ds.Exposure = 125
    ds.FilterType = "BODY FILTER"
    ds.GeneratorPower = 30
    ds.FocalSpots = [1.2]
    ds.ConvolutionKernel = "STANDARD"
    ds.PatientPosition = "FFS"
    ds.RevolutionTime = 0.5
    ds.SingleCollimationWidth = 0.625
    ds.TotalCollimationWidth = 40.0
    ds.TableSpeed = 55.0
    ds.TableFeedPerRotation = 27.5
    ds.SpiralPitchFactor = 0.984
    ds.StudyInstanceUID = uids["study"]
    ds.SeriesInstanceUID = uids["series"]
    ds.StudyID = "1"
    ds.SeriesNumber = 3
    ds.AcquisitionNumber = 1
    ds.InstanceNumber = index + 1  # 1 = most cranial, as scanners number them
    ds.ImagePositionPatient = [-fov / 2, -fov / 2, z]
    ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    ds.FrameOfReferenceUID = uids["frame"]
    ds.PositionReferenceIndicator = "SN"
    ds.SliceLocation = z
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows = size
    ds.Columns = size
    spacing = round(fov / size, 6)
    ds.PixelSpacing = [spacing, spacing]
    ds.BitsAllocated = 16
    ds.BitsStored = 12
    ds.HighBit = 11
    ds.PixelRepresentation = 0
    ds.PixelPaddingValue = 0
    ds.WindowCenter = [40, -600]
    ds.WindowWidth = [400, 1500]
    ds.RescaleIntercept = -1024.0
    ds.RescaleSlope = 1.0
    ds.RescaleType = "HU"
    ds.WindowCenterWidthExplanation = ["WINDOW1", "WINDOW2"]
    # Vendor private block (a CSA-like opaque header: real CT/MR headers carry kilobytes).
    block = ds.private_block(0x0029, "RADCAL BENCH PRIVATE", create=True)
    block.add_new(0x10, "OB", bytes(range(256)) * 12)
    block.add_new(0x11, "LO", "private text")
    block.add_new(0x12, "DS", "1.5")
    ds.PixelData = pixels.tobytes()
    return ds


def ensure_series(root: Path, slices: int, size: int, seed: int = 20240314) -> Path:
    """The series folder under ``root``; written unless already there with these parameters."""
    folder = root / f"ct_{slices}x{size}x{size}"
    manifest = folder / MANIFEST
    params = _params(slices, size, seed)
    if manifest.is_file():
        try:
            found = json.loads(manifest.read_text())
        except ValueError:
            found = None
        names = found.get("files", []) if isinstance(found, dict) else []
        if (
            isinstance(found, dict)
            and found.get("params") == params
            and len(names) == slices
            and all((folder / n).is_file() for n in names)
        ):
            return folder
    if folder.exists():
        if not manifest.is_file():
            raise SystemExit(f"{folder} exists but was not written by this benchmark; move it")
        shutil.rmtree(folder)
    import numpy as np
    from pydicom.uid import generate_uid

    print(f"writing {slices} slices of {size}x{size} to {folder} ...", flush=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    uids = {k: generate_uid() for k in ("study", "series", "frame", "scout")}
    fov = 350.0
    names = []
    for i in range(slices):
        z = 100.0 - i * 1.0  # cranial to caudal, 1 mm apart
        ds = _dataset(i, size, uids, _phantom(rng, size, z, fov), z, fov)
        name = f"{uuid.UUID(int=int(rng.integers(0, 2**63)) << 64 | i).hex}"
        ds.save_as(folder / name, enforce_file_format=True)
        names.append(name)
    manifest.write_text(json.dumps({"params": params, "files": names}, indent=1))
    return folder


def warm_cache(folder: Path) -> int:
    """Read every file once so that every reader starts from the same warm page cache."""
    total = 0
    for path in sorted(folder.iterdir()):
        if path.is_file():
            with path.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    total += len(chunk)
    return total


# --------------------------------------------------------------------------------------------
# Child process: one reader, one load
# --------------------------------------------------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def _import_reader(reader: str) -> dict[str, Any]:
    """Import what ``reader`` needs; return the callables and facts used later."""
    import numpy as np

    if reader == "radcaliper":
        from ingestion.load import load_path

        def load(folder: Path) -> Any:
            result = load_path(folder)
            if len(result.volumes) != 1 or result.rejected:
                raise RuntimeError(f"radcaliper: {result.volumes} / {result.rejected}")
            return result.volumes[0]

        def to_src(vol: Any) -> Any:
            return vol.voxels  # (slices, rows, columns), ascending along the normal

        return {"load": load, "to_src": to_src, "note": "ingestion.load_path (scan + load)"}
    if reader == "sitk":
        import SimpleITK as sitk

        def load(folder: Path) -> Any:
            names = sitk.ImageSeriesReader.GetGDCMSeriesFileNames(str(folder))
            series = sitk.ImageSeriesReader()
            series.SetFileNames(names)
            series.SetOutputPixelType(sitk.sitkFloat32)
            return series.Execute()

        def to_src(img: Any) -> Any:
            return sitk.GetArrayViewFromImage(img)  # zero-copy view, (slices, rows, cols)

        return {
            "load": load,
            "to_src": to_src,
            "note": f"SimpleITK {sitk.Version.VersionString()} ImageSeriesReader, float32",
        }
    if reader.startswith("monai"):
        from monai.transforms import LoadImage

        forced = {"monai-pydicom": "PydicomReader", "monai-itk": "ITKReader"}.get(reader)
        loader = LoadImage(image_only=True, reader=forced)
        picked: dict[str, str] = {}
        for candidate in loader.readers:  # record which reader LoadImage actually calls

            def traced(*a: Any, _read: Any = candidate.read, _name: str = "", **k: Any) -> Any:
                picked["reader"] = _name
                return _read(*a, **k)

            candidate.read = functools.partial(traced, _name=type(candidate).__name__)

        def load(folder: Path) -> Any:
            return loader(str(folder))

        def to_src(img: Any) -> Any:
            arr = img.detach().cpu().numpy() if hasattr(img, "detach") else np.asarray(img)
            return np.ascontiguousarray(np.transpose(arr, (2, 1, 0)))  # (x, y, z) -> (z, y, x)

        def which(img: Any) -> str:
            how = f"reader={forced!r}" if forced else "default reader selection"
            return f"{how}: used {picked.get('reader', '?')}"

        return {"load": load, "to_src": to_src, "which": which, "note": "monai LoadImage"}
    if reader == "io-floor":

        def load(folder: Path) -> Any:
            # File order and geometry from the manifest: no listing, no DICOM parsing at all.
            manifest = json.loads((folder / MANIFEST).read_text())
            names, params = manifest["files"], manifest["params"]
            out = np.empty((len(names), params["rows"], params["columns"]), dtype=np.float32)
            buf = np.empty(out.shape[1:], dtype="<u2")
            view = memoryview(buf).cast("B")
            for i, name in enumerate(names):
                with open(folder / name, "rb") as handle:
                    handle.seek(-buf.nbytes, os.SEEK_END)
                    handle.readinto(view)
                np.subtract(buf, np.float32(1024.0), out=out[i], casting="unsafe")
            return out

        return {
            "load": load,
            "to_src": lambda a: a,
            "note": "raw pixel bytes in manifest (InstanceNumber) order, no DICOM parsing",
        }
    raise SystemExit(f"unknown reader {reader}")


def child_main(args: argparse.Namespace) -> None:
    start_wall = time.time()
    t0 = time.perf_counter()
    reader = args.child
    api = _import_reader(reader)
    import numpy as np

    import_s = time.perf_counter() - t0
    folder = Path(args.series)
    reset_ok = _reset_peak()
    rss_before = _status_kib("VmRSS")
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t1 = time.perf_counter()
    obj = api["load"](folder)
    load_s = time.perf_counter() - t1
    hwm_after = _status_kib("VmHWM")
    maxrss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_after = _status_kib("VmRSS")
    if reset_ok and hwm_after is not None and rss_before is not None:
        peak_kib = hwm_after - rss_before
        method = "VmHWM after - VmRSS before, peak reset via /proc/self/clear_refs"
    else:
        peak_kib = maxrss_after - maxrss_before
        method = "ru_maxrss after - ru_maxrss before (peak not reset: may under-count)"
    arr = api["to_src"](obj)
    out: dict[str, Any] = {
        "reader": reader,
        "startup_s": start_wall - args.spawned,
        "import_s": import_s,
        "load_s": load_s,
        "peak_growth_bytes": peak_kib * 1024,
        "rss_before_bytes": (rss_before or 0) * 1024,
        "rss_after_bytes": (rss_after or 0) * 1024,
        "memory_method": method,
        "note": api["note"],
        "dtype_returned": str(getattr(obj, "dtype", "")) or type(obj).__name__,
        "shape_src": list(arr.shape),
    }
    if reader == "radcaliper":
        out["dtype_returned"] = f"Volume ({obj.voxels.dtype} voxels)"
    if reader == "sitk":
        out["dtype_returned"] = f"sitk.Image ({obj.GetPixelIDTypeAsString()})"
    if "which" in api:
        out["note"] += " (" + api["which"](obj) + ")"
        out["dtype_returned"] = f"{type(obj).__name__} ({obj.dtype})"
    if args.save:
        np.save(args.save, np.asarray(arr, dtype=np.float32))
    Path(args.report).write_text(json.dumps(out))


# --------------------------------------------------------------------------------------------
# Parent: orchestrate, compare, report
# --------------------------------------------------------------------------------------------


def run_child(
    reader: str, series: Path, report: Path, save: Path | None, args: argparse.Namespace
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        reader,
        "--series",
        str(series),
        "--report",
        str(report),
        "--spawned",
        repr(time.time()),
    ]
    if save is not None:
        cmd += ["--save", str(save)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if args.thp == "off":
        env["NUMPY_MADVISE_HUGEPAGE"] = "0"  # numpy otherwise madvises large arrays to THP
    if reader == "monai-itk" and args.itk_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.itk_path, env.get("PYTHONPATH")) if p)
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{reader} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def compare(reference: Path, other: Path) -> tuple[float, str]:
    """Max |difference| in HU, trying the other's slice order as is and reversed."""
    import numpy as np

    ref = np.load(reference, mmap_mode="r")
    arr = np.load(other, mmap_mode="r")
    if ref.shape != arr.shape:
        return float("nan"), f"shape {arr.shape} vs {ref.shape}"

    def maxdiff(flip: bool) -> float:
        worst = 0.0
        n = ref.shape[0]
        for i in range(n):
            a = arr[n - 1 - i] if flip else arr[i]
            worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - ref[i]))))
        return worst

    same = maxdiff(False)
    if same == 0.0:
        return same, "same slice order"
    flipped = maxdiff(True)
    if flipped < same:
        return flipped, "slice order reversed vs radcaliper (sorted by InstanceNumber)"
    return same, "same slice order"


def _cpu_model() -> str:
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown"
    extra = ", ".join(
        f"{label} {fields[key]}"
        for key, label in (("model", "model"), ("cpu MHz", "MHz"), ("cache size", "cache"))
        if key in fields
    )
    name = fields.get("model name", "unknown")
    return f"{name} ({extra})" if extra else name


def _mem_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _versions(itk_path: str | None) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("numpy", "pydicom", "SimpleITK", "monai", "torch", "itk", "python-gdcm"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    if itk_path and out["itk"] == "not installed":
        found = [d.version for d in metadata.distributions(name="itk", path=[itk_path])]
        if found:
            out["itk"] = f"{found[0]} (from --itk-path, monai-itk only)"
    return out


def machine(itk_path: str | None = None) -> dict[str, str]:
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu": _cpu_model(),
        "cores": f"{os.cpu_count()} logical ({len(cpus) if cpus else '?'} usable)",
        "ram": _mem_total(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        **_versions(itk_path),
    }


def _loadavg() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def _fmt_s(v: float) -> str:
    return f"{v:.3f}"


def summarise(runs: dict[str, list[dict[str, Any]]], volume_bytes: int) -> list[dict[str, Any]]:
    rows = []
    for reader, rs in runs.items():
        loads = [r["load_s"] for r in rs]
        peaks = [r["peak_growth_bytes"] for r in rs]
        rows.append(
            {
                "reader": reader,
                "median_s": statistics.median(loads),
                "min_s": min(loads),
                "all_s": loads,
                "startup_s": statistics.median(r["startup_s"] for r in rs),
                "import_s": statistics.median(r["import_s"] for r in rs),
                "peak_bytes": max(peaks),
                "peak_x": max(peaks) / volume_bytes,
                "dtype": rs[0]["dtype_returned"],
                "note": rs[0]["note"],
                "method": rs[0]["memory_method"],
            }
        )
    return rows


def render(
    rows: list[dict[str, Any]],
    diffs: dict[str, tuple[float, str]],
    volume_bytes: int,
    verdict: list[str],
) -> str:
    head = (
        "| reader | load median (s) | load min (s) | vs fastest other | peak growth (MiB) "
        "| x float32 volume | returns | start (s) | imports (s) | max abs diff (HU) |"
    )
    lines = [head, "|" + "---|" * 10]
    fastest = min((r["median_s"] for r in rows if r["reader"] in COMPETITORS), default=float("nan"))
    for r in rows:
        diff, how = diffs.get(r["reader"], (float("nan"), ""))
        diff_text = "reference" if r["reader"] == "radcaliper" else f"{diff:g} ({how})"
        lines.append(
            f"| {r['reader']} | {_fmt_s(r['median_s'])} | {_fmt_s(r['min_s'])} "
            f"| {r['median_s'] / fastest:.2f}x | {r['peak_bytes'] / MIB:.0f} "
            f"| {r['peak_x']:.2f} | {r['dtype']} | {_fmt_s(r['startup_s'])} "
            f"| {_fmt_s(r['import_s'])} | {diff_text} |"
        )
    lines.append("")
    lines.append(f"float32 volume: {volume_bytes / MIB:.0f} MiB.")
    lines.extend(f"- {v}" for v in verdict)
    return "\n".join(lines)


def write_results(text: str, label: str) -> None:
    """Replace (or append) the section between this label's markers in RESULTS.md."""
    start, end = f"<!-- bench_load:{label}:start -->", f"<!-- bench_load:{label}:end -->"
    section = f"{start}\n{text}\n{end}"
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    if start in old and end in old:
        before, rest = old.split(start, 1)
        after = rest.split(end, 1)[1]
        new = before + section + after
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(new)
    print(f"wrote {RESULTS}")


def parent_main(args: argparse.Namespace) -> int:
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    for r in readers:
        if r not in READERS:
            raise SystemExit(f"unknown reader {r!r}; choose from {', '.join(READERS)}")
    if "radcaliper" not in readers:
        readers.insert(0, "radcaliper")
    series = ensure_series(Path(args.data), args.slices, args.size)
    volume_bytes = args.slices * args.size * args.size * 4
    print(f"series: {series} ({args.slices} x {args.size} x {args.size})")
    print(f"page cache warmed: {warm_cache(series) / MIB:.0f} MiB read")
    load_before = _loadavg()
    print(f"load average (1 min): {load_before} on {os.cpu_count()} logical CPUs")
    runs: dict[str, list[dict[str, Any]]] = {r: [] for r in readers}
    with tempfile.TemporaryDirectory(prefix="bench_load_") as tmp:
        tmpdir = Path(tmp)
        saved: dict[str, Path] = {}
        failed: dict[str, str] = {}
        for rep in range(args.repeats):
            for reader in readers:
                if reader in failed:
                    continue
                save = tmpdir / f"{reader}.npy" if rep == 0 else None
                try:
                    res = run_child(reader, series, tmpdir / "report.json", save, args)
                except RuntimeError as exc:
                    if reader == "radcaliper":
                        raise
                    print(f"  {reader} skipped: {exc}", flush=True)
                    failed[reader] = str(exc).strip().splitlines()[-1]
                    continue
                if save is not None:
                    saved[reader] = save
                runs[reader].append(res)
                print(
                    f"  run {rep + 1}/{args.repeats} {reader:<13} load {res['load_s']:.3f} s, "
                    f"peak +{res['peak_growth_bytes'] / MIB:.0f} MiB, "
                    f"imports {res['import_s']:.2f} s",
                    flush=True,
                )
        diffs = {r: compare(saved["radcaliper"], saved[r]) for r in saved if r != "radcaliper"}
    runs = {r: rs for r, rs in runs.items() if rs}
    load_after = _loadavg()
    rows = summarise(runs, volume_bytes)
    by = {r["reader"]: r for r in rows}
    rad = by["radcaliper"]
    others = [r for r in rows if r["reader"] in COMPETITORS]
    verdict = []
    if others:
        fastest = min(others, key=lambda r: r["median_s"])
        ratio = rad["median_s"] / fastest["median_s"]
        ok = "MET" if ratio <= TIME_TARGET else "MISSED"
        verdict.append(
            f"time target (<= {TIME_TARGET}x the fastest other reader, medians): {ok} — "
            f"radcaliper {rad['median_s']:.3f} s vs {fastest['reader']} "
            f"{fastest['median_s']:.3f} s = {ratio:.2f}x"
        )
    mem_ok = "MET" if rad["peak_x"] <= MEMORY_TARGET else "MISSED"
    verdict.append(
        f"memory target (peak growth <= {MEMORY_TARGET}x the float32 volume): {mem_ok} — "
        f"radcaliper {rad['peak_bytes'] / MIB:.0f} MiB = {rad['peak_x']:.2f}x (worst of runs)"
    )
    verdict.append(f"memory method: {rad['method']}")
    verdict.extend(f"{r}: not run ({why})" for r, why in failed.items())
    for r in rows:
        verdict.append(
            f"{r['reader']}: {r['note']}; load times {[round(t, 3) for t in r['all_s']]}"
        )
    table = render(rows, diffs, volume_bytes, verdict)
    print()
    print(table)
    if args.write_results:
        argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
        info = machine(args.itk_path)
        text = "\n".join(
            [
                f"### {args.slices} x {args.size} x {args.size} CT series, {args.repeats} runs "
                "per reader",
                "",
                f"- command: `python benchmarks/bench_load.py {argv}`",
                f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
                f"- machine: {info['cpu']}, {info['cores']}, {info['ram']} RAM, {info['os']}",
                "- versions: "
                + ", ".join(
                    f"{k} {v}" for k, v in info.items() if k not in ("cpu", "cores", "ram", "os")
                ),
                f"- load average (1 min) before / after the runs: {load_before} / {load_after} "
                f"on {os.cpu_count()} logical CPUs (other work on the machine skews times)",
                "- each run is a fresh process; page cache warm (all files read once first); "
                "times are the load call only; numpy transparent huge pages: "
                + ("default" if args.thp == "default" else "off (NUMPY_MADVISE_HUGEPAGE=0)"),
                "",
                table,
            ]
        )
        write_results(text, args.label)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--slices", type=int, default=300)
    parser.add_argument("--size", type=int, default=512, help="rows = columns")
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process runs per reader")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="where the series is written")
    parser.add_argument("--readers", default=DEFAULT_READERS, help=", ".join(READERS))
    parser.add_argument("--write-results", action="store_true", help="refresh RESULTS.md")
    parser.add_argument(
        "--label", default="main", help="which RESULTS.md section --write-results refreshes"
    )
    parser.add_argument(
        "--thp",
        choices=("default", "off"),
        default="default",
        help="'off' sets NUMPY_MADVISE_HUGEPAGE=0 in every child (see README)",
    )
    parser.add_argument(
        "--itk-path", help="a folder holding itk (pip install --target DIR itk) for monai-itk"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--series", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return 0
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
