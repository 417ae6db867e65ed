"""MkDocs hook: the plots bench/README.md shows (bench/*.png) go into the site beside the page that includes it."""

from pathlib import Path

from mkdocs.structure.files import File, Files

_BENCH = Path(__file__).resolve().parents[2] / "bench"


def on_files(files: Files, config: dict) -> Files:  # type: ignore[type-arg]
    for image in sorted(_BENCH.glob("*.png")):
        files.append(File(image.name, str(_BENCH), config["site_dir"], config["use_directory_urls"]))
    return files
