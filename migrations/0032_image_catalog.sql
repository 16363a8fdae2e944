-- The image catalog (domain::image): the platform's entries (tenant_id NULL) and each
-- tenant's own. An entry added through Berth is pinned by digest (domain::image::validate);
-- the three notebook images seeded below were Berth's fixed list before the catalog and
-- keep their tags until a platform admin pins them (the images page says which are not).
CREATE TABLE images (
    id          INTEGER PRIMARY KEY,
    tenant_id   INTEGER REFERENCES tenants (id),
    name        TEXT    NOT NULL CHECK (length(trim(name)) BETWEEN 1 AND 60),
    reference   TEXT    NOT NULL CHECK (length(reference) BETWEEN 1 AND 255 AND reference NOT GLOB '*[ ]*'),
    description TEXT    NOT NULL DEFAULT '' CHECK (length(description) <= 500),
    cuda        TEXT    NOT NULL DEFAULT '' CHECK (length(cuda) <= 40),
    framework   TEXT    NOT NULL DEFAULT '' CHECK (length(framework) <= 40),
    -- Offering ids separated by commas; only offerings that run an image.
    offerings   TEXT    NOT NULL CHECK (offerings <> '' AND offerings NOT GLOB '*cluster*'),
    created_at  INTEGER NOT NULL,
    -- NULL for the entries this migration seeds.
    created_by  INTEGER REFERENCES users (id)
);

-- One name and one reference per catalog (the platform's is scope 0).
CREATE UNIQUE INDEX images_name_per_catalog ON images (coalesce(tenant_id, 0), name);
CREATE UNIQUE INDEX images_reference_per_catalog ON images (coalesce(tenant_id, 0), reference);

-- At most one default per catalog and offering, and only an entry of that catalog that
-- suits the offering.
CREATE TABLE image_defaults (
    scope    INTEGER NOT NULL,
    offering TEXT    NOT NULL CHECK (offering IN ('notebook', 'training', 'inference')),
    image_id INTEGER NOT NULL REFERENCES images (id) ON DELETE CASCADE,
    PRIMARY KEY (scope, offering)
);

CREATE TRIGGER image_defaults_fit_their_image
BEFORE INSERT ON image_defaults
WHEN NOT EXISTS (
    SELECT 1 FROM images
    WHERE id = NEW.image_id AND coalesce(tenant_id, 0) = NEW.scope
      AND instr(',' || offerings || ',', ',' || NEW.offering || ',') > 0
)
BEGIN
    SELECT RAISE(ABORT, 'a default is an entry of its own catalog that suits the offering');
END;

-- An entry keeps its catalog; what it suits changes only by removing and adding it.
CREATE TRIGGER images_keep_their_catalog
BEFORE UPDATE OF tenant_id, offerings ON images
BEGIN
    SELECT RAISE(ABORT, 'a catalog image keeps its catalog and offerings');
END;

-- Which images besides the catalog's a tenant's people may run (domain::image::CustomImages):
-- 'catalog', '*' (any registry) or registry hosts separated by spaces. Any registry is
-- what every tenant had before; platform admins narrow it per tenant.
ALTER TABLE tenants ADD COLUMN custom_images TEXT NOT NULL DEFAULT '*' CHECK (trim(custom_images) <> '');

INSERT INTO images (tenant_id, name, reference, description, cuda, framework, offerings, created_at)
VALUES
    (NULL, 'PyTorch notebook', 'quay.io/jupyter/pytorch-notebook:cuda12-latest',
     'JupyterLab with PyTorch and CUDA 12 (Jupyter Docker Stacks).', '12', 'PyTorch', 'notebook',
     CAST(strftime('%s', 'now') AS INTEGER) * 1000),
    (NULL, 'TensorFlow notebook', 'quay.io/jupyter/tensorflow-notebook:cuda-latest',
     'JupyterLab with TensorFlow and CUDA (Jupyter Docker Stacks).', '12', 'TensorFlow', 'notebook',
     CAST(strftime('%s', 'now') AS INTEGER) * 1000),
    (NULL, 'SciPy notebook', 'quay.io/jupyter/scipy-notebook:latest',
     'JupyterLab with the scientific Python stack, no GPU frameworks.', '', 'SciPy', 'notebook',
     CAST(strftime('%s', 'now') AS INTEGER) * 1000);

INSERT INTO image_defaults (scope, offering, image_id)
SELECT 0, 'notebook', id FROM images WHERE tenant_id IS NULL AND name = 'PyTorch notebook';
