from pipeline.stage import main
from stages.download import run

main(run, "download")
