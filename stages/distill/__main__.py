from pipeline.stage import main
from stages.distill import run_or_note

main(run_or_note, "distill")
