"""Reading a scan's video: its file under the benchmark's layout, the frames a sampling rule picks, and
the decoded RGB frames (PyAV). The video protocol (:mod:`a2c_ppo_acktr.eval.video_protocol`) and the
VSI env's ``video_qa`` mode both read videos here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from a2c_ppo_acktr.common.safe_paths import PathOutsideRoot, contained, plain_name_problem
from a2c_ppo_acktr.envs.vsibench import VSIBenchRowError


class VideoError(VSIBenchRowError):
    """A row's video cannot be read; the message names the file and what to do about it."""


class VideoReaderMissing(VideoError):
    """PyAV, which decodes the videos, is not installed."""


def _av():
    """The ``av`` module (PyAV), or :class:`VideoReaderMissing` in one line saying how to install it."""
    try:
        import av
    except ImportError:
        raise VideoReaderMissing(
            "reading a video needs PyAV, which is not installed: pip install av (or leave env.video_root null to "
            "render walk-throughs)"
        ) from None
    return av


# ------------------------------------------------------------------------------------ frame samplers
@dataclass(frozen=True)
class FrameSample:
    """The frames a reference reader shows the model.

    Attributes:
        indices: ``(N,)`` int64 indices into the video's frames, in the order shown (may repeat).
        read_frames: How many frames the reference's reader decodes and resizes before picking
            (qwen-vl-utils' pixel cap divides by it); ``N`` for readers that pick directly.
    """

    indices: np.ndarray
    read_frames: int


def uniform_frames(total_frames: int, video_fps: float, num_frames: int) -> FrameSample:
    """``np.linspace(0, total_frames - 1, num_frames, dtype=int)``: thinking-in-space's ``load_video``."""
    _check_counts(total_frames, num_frames)
    return FrameSample(np.linspace(0, total_frames - 1, num_frames, dtype=int).astype(np.int64), num_frames)


def _qwen_2fps_read(total_frames: int, video_fps: float) -> np.ndarray:
    """The frames qwen-vl-utils' file readers decode by default (2 fps; ``_read_video_decord``)."""
    import torch
    from qwen_vl_utils.vision_process import smart_nframes

    n = smart_nframes({}, total_frames=total_frames, video_fps=video_fps)
    return torch.linspace(0, total_frames - 1, n).round().long().numpy()


def qwen_2fps_frames(total_frames: int, video_fps: float, num_frames: int) -> FrameSample:
    """lmms-eval's Qwen2-VL / Qwen2.5-VL wrappers: the 2-fps read, then ``linspace(0, n - 1, N, int)`` of it."""
    _check_counts(total_frames, num_frames)
    read = _qwen_2fps_read(total_frames, video_fps)
    return FrameSample(read[np.linspace(0, len(read) - 1, num_frames, dtype=int)].astype(np.int64), len(read))


def qwen3_2fps_frames(total_frames: int, video_fps: float, num_frames: int) -> FrameSample:
    """lmms-eval's Qwen3-VL wrapper: as :func:`qwen_2fps_frames`, repeated picks dropped, last frame kept."""
    _check_counts(total_frames, num_frames)
    read = _qwen_2fps_read(total_frames, video_fps)
    pick = np.unique(np.linspace(0, len(read) - 1, num_frames, dtype=int))
    if len(read) - 1 not in pick:  # never with linspace's endpoint; kept as the reference writes it
        pick = np.unique(np.append(pick, len(read) - 1))
    return FrameSample(read[pick].astype(np.int64), len(read))


FRAME_SAMPLERS: dict[str, Callable[[int, float, int], FrameSample]] = {
    "uniform": uniform_frames,
    "qwen_2fps": qwen_2fps_frames,
    "qwen3_2fps": qwen3_2fps_frames,
}


def _check_counts(total_frames: int, num_frames: int) -> None:
    if num_frames < 1:
        raise ValueError(f"num_frames={num_frames} must be >= 1")
    if total_frames < 1:
        raise ValueError(f"a video needs at least one frame, got total_frames={total_frames}")


def sample_frames(sampling: str, total_frames: int, video_fps: float, num_frames: int) -> FrameSample:
    """The frames sampler ``sampling`` (a :data:`FRAME_SAMPLERS` name) shows of a video.

    Raises:
        ValueError: On an unknown sampler (the message lists the known ones), or a video too short for it.
    """
    if sampling not in FRAME_SAMPLERS:
        raise ValueError(f"unknown frame sampling {sampling!r}; known: {sorted(FRAME_SAMPLERS)}")
    return FRAME_SAMPLERS[sampling](total_frames, video_fps, num_frames)


# --------------------------------------------------------------------------------------- video files
def video_file(video_root: str | Path, dataset: str, scene_name: str, where: str = "a VSI-Bench row") -> Path:
    """Where the benchmark keeps a scene's video: ``<video_root>/<dataset>/<scene_name>.mp4``.

    Raises:
        PathOutsideRoot: The names (they come from the rows) or a symbolic link lead out of
            ``video_root``; the message names ``where``.
    """
    for name in (dataset, scene_name):
        problem = plain_name_problem(name)
        if problem:
            raise PathOutsideRoot(f"{where}: {name[:80]!r} {problem}; a video is named <dataset>/<scene_name>.mp4")
    return contained(video_root, Path(dataset) / f"{scene_name}.mp4", where)


def _video_error(path: Path, e: Exception) -> VideoError:
    reason = getattr(e, "strerror", None) or str(e)
    return VideoError(
        f"cannot read video {str(path)!r}: {reason}; the file is damaged or not a video (download or re-encode it)"
    )


def probe_video(path: str | Path) -> tuple[int, float]:
    """``(number of frames, frames per second)`` of a video file, without decoding it.

    Frames are counted from the video stream's packets (one per frame in mp4), as decord counts
    its index; the rate is the stream's average rate, as ``torchvision.io.read_video`` reports it.

    Raises:
        FileNotFoundError: No file at ``path``.
        VideoError: The file is not a readable video.
        VideoReaderMissing: PyAV is not installed.
    """
    av = _av()

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video {str(path)!r} does not exist")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoError(f"{str(path)!r} holds no video stream; expected a walk-through video (mp4)")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate
            total = sum(1 for packet in container.demux(stream) if packet.size)
    except av.error.FFmpegError as e:
        raise _video_error(path, e) from None
    if total == 0 or not rate:
        raise VideoError(
            f"video {str(path)!r} has {total} frames at rate {rate}; the file is empty or damaged (download it again)"
        )
    return total, float(rate)


def decode_frames(path: str | Path, indices: Sequence[int]) -> np.ndarray:
    """The frames at ``indices`` (any order, repeats allowed) as ``(N, H, W, 3)`` uint8 RGB.

    Decodes from the start up to the last index asked for (PyAV, frame-threaded).

    Raises:
        VideoError: The file cannot be decoded, or ends before an index asked for (truncated).
    """
    av = _av()

    path = Path(path)
    wanted = {int(i) for i in indices}
    last = max(wanted)
    got: dict[int, np.ndarray] = {}
    decoded = 0
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for k, frame in enumerate(container.decode(stream)):
                decoded = k + 1
                if k in wanted:
                    got[k] = frame.to_ndarray(format="rgb24")
                if k >= last:
                    break
    except (av.error.FFmpegError, IndexError) as e:
        raise _video_error(path, e) from None
    if len(got) < len(wanted):
        missing = min(wanted - set(got))
        raise VideoError(
            f"video {str(path)!r} ends after {decoded} decodable frames but frame {missing} was asked for: the file is "
            "truncated "
            "(download it again)"
        )
    return np.stack([got[int(i)] for i in indices])


@dataclass
class VideoClip:
    """The frames of one video shown to the model.

    Attributes:
        path: The video file.
        frames: ``(N, H, W, 3)`` uint8 RGB, in the order shown.
        sample: Which frames (:class:`FrameSample`).
        total_frames: Frames in the video; ``video_fps`` its frame rate.
        visual: What the model is given (resized frames for Qwen, the frames themselves otherwise).
    """

    path: Path
    frames: np.ndarray
    sample: FrameSample
    total_frames: int
    video_fps: float
    visual: Any = None


def read_clip(path: str | Path, sampling: str, num_frames: int) -> VideoClip:
    """Probe, sample and decode one video (see :func:`sample_frames`)."""
    path = Path(path)
    total, fps = probe_video(path)
    try:
        sample = sample_frames(sampling, total, fps, num_frames)
    except ValueError as e:
        raise VideoError(
            f"video {str(path)!r} ({total} frames at {fps:g} fps) cannot be sampled with {sampling!r}: {e}"
        ) from None
    return VideoClip(
        path=path, frames=decode_frames(path, sample.indices), sample=sample, total_frames=total, video_fps=fps
    )
