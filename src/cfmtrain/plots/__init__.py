"""The paper's figures drawn from results files (training runs, sweeps, simulations), never from
training: each figure is a function of files and writes a PNG and a PDF."""
