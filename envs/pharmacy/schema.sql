-- Community pharmacy. Ids are TEXT with a readable prefix; dates are 'YYYY-MM-DD'.
CREATE TABLE patients (
    patient_id TEXT PRIMARY KEY CHECK (patient_id LIKE 'P-%'),
    name       TEXT NOT NULL,
    birth_date TEXT NOT NULL,
    allergy    TEXT
);

CREATE TABLE drugs (
    drug_id     TEXT PRIMARY KEY CHECK (drug_id LIKE 'D-%'),
    name        TEXT NOT NULL UNIQUE,
    stock       INTEGER NOT NULL CHECK (stock >= 0),
    price_cents INTEGER NOT NULL CHECK (price_cents > 0),
    controlled  INTEGER NOT NULL CHECK (controlled IN (0, 1))
);

CREATE TABLE prescriptions (
    rx_id        TEXT PRIMARY KEY CHECK (rx_id LIKE 'RX-%'),
    patient_id   TEXT NOT NULL REFERENCES patients (patient_id),
    drug_id      TEXT NOT NULL REFERENCES drugs (drug_id),
    refills_left INTEGER NOT NULL CHECK (refills_left BETWEEN 0 AND 12),
    status       TEXT NOT NULL CHECK (status IN ('active', 'cancelled'))
);

CREATE TABLE fills (
    fill_id     TEXT PRIMARY KEY CHECK (fill_id LIKE 'F-%'),
    rx_id       TEXT NOT NULL REFERENCES prescriptions (rx_id),
    quantity    INTEGER NOT NULL CHECK (quantity BETWEEN 1 AND 90),
    filled_on   TEXT NOT NULL,
    total_cents INTEGER NOT NULL CHECK (total_cents > 0)
);
