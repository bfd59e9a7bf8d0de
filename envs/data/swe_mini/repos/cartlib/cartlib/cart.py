from cartlib.discount import apply_discount


class Cart:
    """Items by name: (unit price in cents, quantity)."""

    def __init__(self, items=None):
        self.items = dict(items or {})

    def add(self, name, price, qty=1):
        if qty < 1:
            raise ValueError("quantity must be at least 1")
        _, have = self.items.get(name, (price, 0))
        self.items[name] = (price, have + qty)

    def remove(self, name, qty=1):
        """Take `qty` of an item out; the item disappears when none is left."""
        if name not in self.items:
            raise KeyError(name)
        price, have = self.items[name]
        if qty >= have:
            del self.items[name]
        else:
            self.items[name] = (price, have - qty)

    def count(self):
        return sum(q for _, q in self.items.values())

    def total(self, discount_percent=0):
        subtotal = sum(p * q for p, q in self.items.values())
        return apply_discount(subtotal, discount_percent)
