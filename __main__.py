from infra.program import run

run()
