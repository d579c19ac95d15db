from pipeline.stage import main
from stages.card import run

main(run, "card")
