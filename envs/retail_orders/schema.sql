-- Online retail: customers with addresses and payment methods, a product catalogue with
-- variants and stock, orders with items, the payments (charges and refunds) made on them,
-- and returns. Ids are TEXT with a readable prefix; money is REAL rounded to 2 decimals.

CREATE TABLE customers (
    customer_id TEXT PRIMARY KEY CHECK (customer_id LIKE 'C-%'),
    first_name  TEXT NOT NULL CHECK (length(first_name) > 0),
    last_name   TEXT NOT NULL CHECK (length(last_name) > 0),
    email       TEXT NOT NULL UNIQUE CHECK (email LIKE '%_@_%._%'),
    phone       TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('active', 'suspended')),
    created_on  TEXT NOT NULL CHECK (date(created_on) = created_on)
);

CREATE TABLE addresses (
    address_id  TEXT PRIMARY KEY CHECK (address_id LIKE 'A-%'),
    customer_id TEXT NOT NULL REFERENCES customers (customer_id),
    line1       TEXT NOT NULL CHECK (length(line1) > 0),
    line2       TEXT NOT NULL DEFAULT '',
    city        TEXT NOT NULL CHECK (length(city) > 0),
    state       TEXT NOT NULL CHECK (length(state) = 2),
    zip         TEXT NOT NULL CHECK (length(zip) = 5),
    is_default  INTEGER NOT NULL CHECK (is_default IN (0, 1))
);

-- A card has brand, last4 and expiry (YYYY-MM) and no balance; a gift card has a balance.
CREATE TABLE payment_methods (
    payment_method_id TEXT PRIMARY KEY CHECK (payment_method_id LIKE 'PM-%'),
    customer_id       TEXT NOT NULL REFERENCES customers (customer_id),
    kind              TEXT NOT NULL CHECK (kind IN ('card', 'gift_card')),
    brand             TEXT CHECK (brand IS NULL OR brand IN ('visa', 'mastercard', 'amex', 'discover')),
    last4             TEXT NOT NULL CHECK (length(last4) = 4),
    expires           TEXT CHECK (expires IS NULL OR expires GLOB '[0-9][0-9][0-9][0-9]-[0-1][0-9]'),
    balance           REAL CHECK (balance IS NULL OR balance >= 0),
    CHECK (
        (kind = 'card' AND brand IS NOT NULL AND expires IS NOT NULL AND balance IS NULL)
        OR (kind = 'gift_card' AND brand IS NULL AND expires IS NULL AND balance IS NOT NULL)
    )
);

CREATE TABLE products (
    product_id TEXT PRIMARY KEY CHECK (product_id LIKE 'P-%'),
    name       TEXT NOT NULL UNIQUE,
    category   TEXT NOT NULL
        CHECK (category IN ('apparel', 'footwear', 'electronics', 'outdoors', 'kitchen', 'home')),
    status     TEXT NOT NULL CHECK (status IN ('active', 'discontinued'))
);

CREATE TABLE variants (
    variant_id TEXT PRIMARY KEY CHECK (variant_id LIKE 'V-%'),
    product_id TEXT NOT NULL REFERENCES products (product_id),
    options    TEXT NOT NULL,
    price      REAL NOT NULL CHECK (price > 0),
    stock      INTEGER NOT NULL CHECK (stock >= 0),
    UNIQUE (product_id, options)
);

-- pending: placed, still changeable; processing: being packed, can only be cancelled;
-- shipped: in transit; delivered: returnable within the return window; cancelled: refunded.
CREATE TABLE orders (
    order_id        TEXT PRIMARY KEY CHECK (order_id LIKE 'O-%'),
    customer_id     TEXT NOT NULL REFERENCES customers (customer_id),
    address_id      TEXT NOT NULL REFERENCES addresses (address_id),
    status          TEXT NOT NULL
        CHECK (status IN ('pending', 'processing', 'shipped', 'delivered', 'cancelled')),
    placed_on       TEXT NOT NULL CHECK (date(placed_on) = placed_on),
    delivered_on    TEXT CHECK (delivered_on IS NULL OR date(delivered_on) = delivered_on),
    tracking_number TEXT,
    total           REAL NOT NULL CHECK (total >= 0),
    cancel_reason   TEXT CHECK (
        cancel_reason IS NULL
        OR cancel_reason IN ('no_longer_needed', 'ordered_by_mistake', 'found_better_price', 'delivery_too_slow')
    ),
    CHECK ((status = 'cancelled') = (cancel_reason IS NOT NULL)),
    CHECK ((status = 'delivered') = (delivered_on IS NOT NULL)),
    CHECK (status NOT IN ('shipped', 'delivered') OR tracking_number IS NOT NULL),
    CHECK (delivered_on IS NULL OR delivered_on >= placed_on)
);

CREATE TABLE order_items (
    order_item_id TEXT PRIMARY KEY CHECK (order_item_id LIKE 'OI-%'),
    order_id      TEXT NOT NULL REFERENCES orders (order_id),
    variant_id    TEXT NOT NULL REFERENCES variants (variant_id),
    quantity      INTEGER NOT NULL CHECK (quantity > 0),
    unit_price    REAL NOT NULL CHECK (unit_price >= 0),
    status        TEXT NOT NULL CHECK (status IN ('ordered', 'return_requested', 'returned'))
);

CREATE TABLE returns (
    return_id         TEXT PRIMARY KEY CHECK (return_id LIKE 'R-%'),
    order_id          TEXT NOT NULL REFERENCES orders (order_id),
    payment_method_id TEXT NOT NULL REFERENCES payment_methods (payment_method_id),
    reason            TEXT NOT NULL
        CHECK (reason IN ('defective', 'wrong_item', 'wrong_size', 'not_as_described', 'changed_mind')),
    status            TEXT NOT NULL CHECK (status IN ('requested', 'refunded', 'rejected', 'cancelled')),
    requested_on      TEXT NOT NULL CHECK (date(requested_on) = requested_on),
    refund_amount     REAL NOT NULL CHECK (refund_amount >= 0)
);

CREATE TABLE return_items (
    return_id     TEXT NOT NULL REFERENCES returns (return_id),
    order_item_id TEXT NOT NULL REFERENCES order_items (order_item_id),
    PRIMARY KEY (return_id, order_item_id)
);

-- A charge takes money from a payment method for an order; a refund gives it back, and names
-- the return it settles when it comes from one.
CREATE TABLE payments (
    payment_id        TEXT PRIMARY KEY CHECK (payment_id LIKE 'PAY-%'),
    order_id          TEXT NOT NULL REFERENCES orders (order_id),
    payment_method_id TEXT NOT NULL REFERENCES payment_methods (payment_method_id),
    kind              TEXT NOT NULL CHECK (kind IN ('charge', 'refund')),
    amount            REAL NOT NULL CHECK (amount > 0),
    return_id         TEXT REFERENCES returns (return_id),
    CHECK (kind = 'refund' OR return_id IS NULL)
);

-- Lookups by owner: a customer's addresses, cards and orders; an order's items, returns and
-- payments; a product's variants. The tables are small, but tools make these lookups on every
-- call, and without an index each one reads the whole table.
CREATE INDEX addresses_by_customer ON addresses (customer_id);
CREATE INDEX payment_methods_by_customer ON payment_methods (customer_id);
CREATE INDEX orders_by_customer ON orders (customer_id);
CREATE INDEX order_items_by_order ON order_items (order_id);
CREATE INDEX returns_by_order ON returns (order_id);
CREATE INDEX payments_by_order ON payments (order_id);
CREATE INDEX variants_by_product ON variants (product_id);
