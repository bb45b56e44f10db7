-- The document store behind store.<ns>.* and collections.document_store.*.
-- Every row belongs to one namespace ("store") and, through the target's
-- scope columns, to one tenant; the broker injects both into every statement.
CREATE TABLE IF NOT EXISTS document_store (
    id         bigserial PRIMARY KEY,
    tenant_id  text        NOT NULL,
    store      text        NOT NULL CHECK (length(store) BETWEEN 1 AND 128),
    key        text,
    data       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- the clamp every statement carries
CREATE INDEX IF NOT EXISTS document_store_tenant_store_idx ON document_store (tenant_id, store, id);
-- an optional natural key per namespace
CREATE UNIQUE INDEX IF NOT EXISTS document_store_tenant_store_key_idx
    ON document_store (tenant_id, store, key) WHERE key IS NOT NULL;
