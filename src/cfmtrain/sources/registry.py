"""The registry of data sets: the paper's eight (Table 3) plus the embedded `mini`.

Each entry says where the data comes from (a URL, `manual` with instructions, or `generated`),
its checksum where one is published (never invented: with `None` a download is accepted only when
its complete length was confirmed, and its sha256 is then recorded), its format and the converter
that turns it into the pipeline's extxyz shards.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cfmtrain.frames.formats import FORMATS
from cfmtrain.frames.labels import ENERGY_KEY, FORCES_KEY, STRESS_KEY
from cfmtrain.paper import TABLE3

SOURCES = ("download", "manual", "generated")
PAPER_NAMES = {row.key: row.name for row in TABLE3}  # the data sets' names in Table 3


@dataclass(frozen=True)
class SourceFile:
    """One file to download: URL, the local file name, and its published checksum (or None)."""

    url: str
    filename: str
    checksum: str | None = None
    algorithm: str = "sha256"
    size: str = ""  # human-readable size as published, for the instructions only


@dataclass(frozen=True)
class SourceKeys:
    """Where a source keeps its labels (info/array keys, or ASE calculator results)."""

    energy: str = ENERGY_KEY
    forces: str = FORCES_KEY
    stress: str | None = STRESS_KEY
    stress_unit: str = "eV/A^3"  # see cfmtrain.readers.options.STRESS_UNITS


@dataclass(frozen=True)
class DatasetEntry:
    """One data set: provenance, where to get it, and how to convert it."""

    name: str
    paper_name: str
    citation: str
    doi: str | None
    license: str
    source: str  # one of SOURCES
    format: str  # "mptrj-json", "extxyz", "extxyz-zip", "ase-db", "extxyz|ase-db", ...
    converter: str | None  # "mptrj", "ase" or None (no converter: see notes)
    files: tuple[SourceFile, ...] = ()
    instructions: str = ""
    keys: SourceKeys = field(default_factory=SourceKeys)
    notes: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"dataset {self.name!r}: source {self.source!r} not in {SOURCES}")
        if self.source == "download" and not self.files:
            raise ValueError(f"dataset {self.name!r}: a download needs at least one file")
        if self.source == "manual" and not self.instructions:
            raise ValueError(f"dataset {self.name!r}: a manual set needs instructions")

    def describe(self) -> str:
        """A multi-line human description: provenance, source and instructions."""
        lines = [
            f"{self.name}: {self.paper_name}",
            f"  citation: {self.citation}",
            f"  DOI:      {self.doi or '-'}",
            f"  license:  {self.license}",
            f"  source:   {self.source}; format {self.format}; converter {self.converter}",
        ]
        for f in self.files:
            check = (f"{f.algorithm} {f.checksum}" if f.checksum else
                     "none published (accepted only with a confirmed length; sha256 recorded)")
            lines.append(f"  file:     {f.filename} ({f.size or 'size ?'}) <- {f.url}")
            lines.append(f"            checksum: {check}")
        if self.instructions:
            lines.append("  instructions:")
            lines.extend(f"    {line}" for line in self.instructions.strip().splitlines())
        if self.notes:
            lines.append(f"  notes: {self.notes}")
        return "\n".join(lines)


_READ_FILES = ", ".join(f"*{suffix}" for suffix in FORMATS)  # what `cfmtrain convert` reads
_MANUAL_OWN_FILES = """\
No public source of this data set is known to us. To use your own copy:
1. Put the frames into one folder, e.g. data/raw/{name}/, as files cfmtrain reads:
   {formats}.
2. Each frame needs an energy (eV) and forces (eV/A); stress (3x3 or Voigt) is optional.
   By default the converter reads MACE's keys REF_energy / REF_forces / REF_stress, and also
   ASE's calculator results (energy, forces, stress) when you pass those key names.
3. Point the config at that folder, or run
   cfmtrain convert {name} --input data/raw/{name} --output results/data/{name}
   (add --energy-key/--forces-key/--stress-key if your files use other names)."""

DATASETS: dict[str, DatasetEntry] = {}


def _register(entry: DatasetEntry) -> None:
    DATASETS[entry.name] = entry


_register(DatasetEntry(
    name="mptrj",
    paper_name=PAPER_NAMES["mptrj"],
    citation=("B. Deng et al., CHGNet as a pretrained universal neural network potential for "
              "charge-informed atomistic modelling, Nat. Mach. Intell. 5, 1031 (2023)"),
    doi="10.6084/m9.figshare.23713842",
    license="see the figshare record (item 23713842)",
    source="download",
    format="mptrj-json",
    converter="mptrj",
    files=(SourceFile(
        url="https://figshare.com/ndownloader/files/41619375",
        filename="MPtrj_2022.9_full.json",
        # figshare's own MD5 of file 41619375 (its API's `computed_md5` for article 23713842 v2,
        # size 12,188,168,685 bytes), as quoted from that API by a public project; we could not
        # query figshare from here nor download the 11 GiB to recompute it.
        checksum="50ead5f27f9a4f6beb7564c4188f1e9f",
        algorithm="md5",
        size="11.35 GiB (12,188,168,685 bytes)",
    ),),
    keys=SourceKeys(energy="uncorrected_total_energy", forces="force", stress="stress",
                    stress_unit="kBar-vasp"),
    notes=("JSON mp-id -> frame-id -> record, streamed with ijson. Energy: "
           "uncorrected_total_energy by default (what the MACE-MP-0 extxyz used); "
           "corrected_total_energy (MP2020-corrected) is the alternative."),
))

_register(DatasetEntry(
    name="mptrj_extxyz",
    paper_name=f"{PAPER_NAMES['mptrj']} (extxyz export)",
    citation="MPtrj as extxyz, Matbench Discovery data files (2024-09-03-mp-trj.extxyz.zip)",
    doi=None,
    license="see the figshare record (Matbench Discovery data files)",
    source="download",
    format="extxyz-zip",
    converter="ase",
    files=(SourceFile(
        url="https://figshare.com/ndownloader/files/49034296",
        filename="2024-09-03-mp-trj.extxyz.zip",
        checksum="7f433171e4e5f2ef9304dccd42d5488f",
        algorithm="md5",
    ),),
    # The export stores the raw (uncorrected) energy as `energy`; its `stress` has no documented
    # unit or sign convention, so stress is not read unless you pass --stress-key explicitly.
    keys=SourceKeys(energy="energy", forces="forces", stress=None),
    notes=("One member per mp-id, each a multi-frame extxyz; members are streamed from the zip. "
           "Same frames as `mptrj`; use one or the other."),
))

_register(DatasetEntry(
    name="hea",
    paper_name=f"{PAPER_NAMES['hea']} (HEA25)",
    citation=("N. Lopanitsyna, G. Fraux, M. A. Springer, S. De, M. Ceriotti, Modeling "
              "high-entropy transition metal alloys with alchemical compression, "
              "Phys. Rev. Materials 7, 045802 (2023)"),
    doi="10.24435/materialscloud:73-yn",
    license="CC BY 4.0",
    source="manual",
    format="extxyz",
    converter="ase",
    instructions="""\
The HEA25 data set is an archive record on Materials Cloud; we do not know a stable direct
file URL, so download it by hand:
1. Open https://doi.org/10.24435/materialscloud:73-yn in a browser.
2. Under "Files", download the extended-XYZ data of the 25,000 training structures;
   if the record lists a checksum for a file, check it (`md5sum FILE`).
3. Unpack it into one folder, e.g. data/raw/hea/, so that it holds the *.extxyz files.
4. Run: cfmtrain convert hea --input data/raw/hea --output results/data/hea
   The files appear to use ASE's keys (energy, forces, stress). Stress is skipped by default:
   check its unit in the record's description, then pass --stress-key stress --stress-unit UNIT.""",
    keys=SourceKeys(energy="energy", forces="forces", stress=None),
    notes="25 d-block transition metals, fcc and bcc cells of 36-48 atoms in the paper's mix.",
))

_register(DatasetEntry(
    name="water_clusters",
    paper_name=PAPER_NAMES["water_clusters"],
    citation=("H. Helal et al., Acceleration of Graph Neural Network-Based Prediction Models in "
              "Chemistry via Co-Design Optimization on Intelligence Processing Units, "
              "J. Chem. Inf. Model. 64, 1568 (2024); HydroNet, arXiv:2012.00131"),
    doi=None,
    license="see the figshare record",
    source="download",
    format="hydronet-xyz-zip",
    converter=None,
    files=(SourceFile(
        url="https://figshare.com/ndownloader/files/38063847",
        filename="W3-W30_all_geoms_TTM2.1-F.zip",
        # None: figshare computes an MD5 of every file, but we found no copy of this one's and
        # could not query figshare offline. The download is accepted only if its length is
        # confirmed (Content-Length / Content-Range); its sha256 is then recorded beside it.
        checksum=None,
    ),),
    instructions="""\
The public HydroNet archive (downloaded by `cfmtrain download water_clusters`) holds, per cluster
size, plain XYZ geometries with one TTM2.1-F energy (kcal/mol) per cluster and no forces (as read by
PyG's HydroNet loader), which is not enough to train MACE on energies and forces, and we know of no
public force-labelled version of the paper's set.
1. Produce force labels for the clusters you use (e.g. with your TTM2.1-F or DFT code), write them
   as extxyz with REF_energy (eV) and REF_forces (eV/A) into data/raw/water_clusters/.
2. Run: cfmtrain convert water_clusters --input data/raw/water_clusters \\
        --output results/data/water_clusters""",
    notes="Clusters of 3-25 water molecules (9-75 atoms) in the paper's mix; no periodicity.",
))

_register(DatasetEntry(
    name="cuni",
    paper_name=PAPER_NAMES["cuni"],
    citation=("H. W. Sprueill, J. A. Bilbrey, Q. Pang, P. V. Sushko, Active sampling for neural "
              "network potentials: Accelerated simulations of shear-induced deformation in Cu-Ni "
              "multilayers, J. Chem. Phys. 158(11) (2023)"),
    doi=None,
    license="see the PNNL DataHub record",
    source="manual",
    format="extxyz|ase-db",
    converter="ase",
    instructions="""\
The CuNi data are on PNNL DataHub (dataset 33219), which hands files out through a web form:
1. Open https://data.pnnl.gov/group/nodes/dataset/33219 and request/download the files.
2. Put the structure files (extxyz or ASE .db) into data/raw/cuni/.
3. Run: cfmtrain convert cuni --input data/raw/cuni --output results/data/cuni
   (pass --energy-key/--forces-key/--stress-key to match the files' key names).""",
    notes="Cu-Ni multilayer cells of 492-500 atoms, mostly fcc, periodic.",
))

_register(DatasetEntry(
    name="tmd",
    paper_name=PAPER_NAMES["tmd"],
    citation=("S. E. Muller, M. P. Prange, Z. Lu, W. S. Rosenthal, J. A. Bilbrey, An open "
              "database of computed bulk ternary transition metal dichalcogenides, "
              "Sci. Data 10, 336 (2023)"),
    doi="10.1038/s41597-023-02103-4",
    license="see the article's data record",
    source="manual",
    format="extxyz|ase-db",
    converter="ase",
    instructions=f"""\
The article's "Data Records" section names where its database is deposited; we do not know a
direct file URL, nor whether the paper's 219,627 frames are exactly that record.
1. Open https://doi.org/10.1038/s41597-023-02103-4, follow its data record and download the
   structure files with energies and forces (or use your own TMD frames).
2. Write or copy them into data/raw/tmd/ as files cfmtrain reads:
   {_READ_FILES}.
3. Run: cfmtrain convert tmd --input data/raw/tmd --output results/data/tmd
   (pass --energy-key/--forces-key/--stress-key to match the files' key names).""",
    notes="Layered ternary TMD cells of 16-96 atoms in the paper's mix, periodic.",
))

for _name, _note in (
    ("liquid_water", "768-atom periodic boxes of liquid water."),
    ("al_hcl", "281-atom periodic cells of aluminium ions in aqueous HCl."),
    ("zeolite", "Periodic zeolite frameworks with solvent in the pores, 203-408 atoms."),
):
    _register(DatasetEntry(
        name=_name, paper_name=PAPER_NAMES[_name], doi=None, license="unknown",
        citation="used by Firoz et al. (HPDC 2025) without a public source",
        source="manual", format="extxyz|ase-db", converter="ase",
        instructions=_MANUAL_OWN_FILES.format(name=_name, formats=_READ_FILES), notes=_note,
    ))

_register(DatasetEntry(
    name="mini",
    paper_name="mini (embedded default, mirrors Table 3)",
    citation="generated by cfmtrain (ASE EMT and TIP3P labels)",
    doi=None,
    license="MIT (generated)",
    source="generated",
    format="extxyz",
    converter=None,
    instructions="Generated offline: `cfmtrain generate` (nothing to download).",
))


def get_dataset(name: str) -> DatasetEntry:
    """The registry entry called `name`; a clear error listing the known names otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        known = ", ".join(sorted(DATASETS))
        raise KeyError(f"unknown data set {name!r}; known data sets: {known}") from None
