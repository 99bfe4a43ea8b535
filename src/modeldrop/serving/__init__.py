"""How the endpoint will serve: the serving image (`image`), the engine env from one meaning-to-key
mapping (`engine_env`), the GPU memory plan (`memory_plan`) and the combined `plan`. Data, not code, in
`data/` (known images, the instance catalog with prices).

May import: `contracts`. Pure: no AWS calls.
"""
