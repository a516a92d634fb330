from infra.program import main

main()
